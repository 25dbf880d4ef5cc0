#!/usr/bin/env bash
# The GPU checks of batchfit, stage by stage, on a machine with CUDA: each stage's log and results
# file go to $OUT (default bench/results/). A GPU session runs `smoke` first. Stages:
#   smoke      the first check, in at most 8 minutes on one H100, each part under a timeout set by
#              its budget (below), batchfit and the truth alone (no Lightning or accelerate): the gpu
#              tests, the README's main command on cuda:0, find on the built-ins and on ResNet-50 AMP
#   gpu-tests  the tests marked gpu (pytest -m gpu), those never run on a GPU first, with every test's
#              outcome and what the passing ones print (-rA, and --junitxml): their figures
#   tests      the rest of the suite, with CUDA present (tests that mean the CPU say so): in 5
#              processes where pytest-xdist is installed (about 5 minutes on the H100's 16 cores,
#              where one process takes longer than a device call may), the gpu tests left to
#              gpu-tests (processes beside each other would move each other's free memory)
#   find       bench/find.py --device cuda: the truth, Lightning and accelerate
#   expandable with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: bench/find.py (one model per
#              case) on mlp, cnn, transformer and resnet50-amp, then CUDA's allocator history of each
#              under that setting (allocator-history-cuda-expandable-*.json: where its tensors sit)
#   curves     bench/find_curves.py --device cuda: every trial near each boundary, then find_replay.py on
#              them, with the opening's allocator requests replayed and without (--no-forecast)
#   explore    bench/explore.py --device cuda
#   compare    bench/compare.py --device cuda
#   predict    bench/predict.py --device cuda: predict recorded under 16 GiB and 80 GiB caps, judged
#              by the truth under the others (and from the CPU alone), beside MemTracker; then
#              bench/allocator_history.py: CUDA's allocator history of each workload's trials at
#              predict's record sizes (2, 4, 8), without stack frames (a file each, under a few MB).
#              Long: one workload a call (predict:resnet50), as the truth scans every target
#   advise     batchfit advise on built-in examples (the cnn unless named: advise:mlp,cnn,transformer)
#              on cuda, each under 1GiB (the transformer 2GiB, as the README's main
#              command): its JSON and its wall time, the time a user waits for the checklist
# Usage: bash bench/gpu_session.sh [--plan] STAGE [STAGE ...]   (e.g. smoke, or gpu-tests find curves)
# --plan prints the smoke's commands, each with its timeout, and runs nothing (no CUDA needed).
# The results files record the commit: where the tree is not a git checkout (a copy on a GPU
# machine), give it as BATCHFIT_COMMIT=<hash>, else they record the package's version.
# find, expandable, curves, explore, compare, predict and advise take workloads after a colon, to split a long stage:
# curves:resnet50,gpt2 (their files are then named after them: find-curves-cuda-resnet50-gpt2.json).
# Python: $PYTHON, else .venv/bin/python, else python3. Wheels in .whl/ (what the machine lacks:
# ../shared/tools/gpu-wheels.sh builds omegaconf's) are installed into /tmp/site first, and src/ is
# put on the path, so a machine whose Python has torch and the bench packages needs no set-up.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out=${OUT:-bench/results}
if [ -n "${PYTHON:-}" ]; then py=$PYTHON; elif [ -x .venv/bin/python ]; then py=.venv/bin/python; else py=python3; fi
export PYTHONUNBUFFERED=1
stages="smoke gpu-tests tests find expandable curves explore compare predict advise"
plan=0
if [ "${1:-}" = --plan ]; then plan=1; shift; fi
if [ $# -eq 0 ]; then
    echo "usage: bash bench/gpu_session.sh [--plan] STAGE [STAGE ...]; stages: $stages" >&2
    exit 2
fi
for stage in "$@"; do
    name=${stage%%:*}
    if [[ " $stages " != *" $name "* ]] || { [[ $stage == *:* ]] && [[ $name == *tests || $name == smoke ]]; }; then
        echo "gpu_session: unknown stage '$stage'; stages: $stages (all but smoke and the tests take :WORKLOAD,...)" >&2
        exit 2
    fi
done

# The smoke's parts: NAME, its budget in seconds, and its command. The budgets sum to SMOKE_SECONDS
# less half a minute for the checks before it and Python's starts; each comes from the H200's smoke
# of 2026-11-26 (bench/data/h200-2026-11-26-2/, docs/benchmarks.md's "The GPU session" section).
# The gpu tests ran out of time there (140 s; 22 of the 41 then collected, bench/data/cpu-2026-11-28/
# gpu-tests-run.json; the DDP one 42 s alone, gpu-tests-first-failure.log), so they run under a
# deadline (tests/conftest.py): those not begun by it are skipped and named, the part ends with its
# summary and each test's time. The tests no
# GPU session has passed (bench/gpu_never_run.txt, from the recorded logs by bench/gpu_tests_run.py) go
# first (BATCHFIT_TEST_FIRST), then the files in the order given. Each pytest part writes every test's
# name and outcome (-rA in its log, --junitxml beside it), and bench/junit_outcomes.py counts them: a
# skipped test is counted as skipped, and a part with one has not passed. The adapters took 56 s; the
# main command 18 s; the scanning truth 18 s on the cnn and 17 s on the transformer (the mlp's, 44 s,
# is left to the find stage; smoke-session.log); ResNet-50 AMP's scan outran 100 s, so the smoke
# checks its boundary alone (--window 0: the answer's 10 and 20 steps, the size above).
SMOKE_SECONDS=480
NEVER_RUN=bench/gpu_never_run.txt
GPU_TEST_FILES="tests/prediction/test_predict.py tests/runtime/distributed/test_lockstep.py tests/test_gpu.py tests/data_check/test_check_data.py tests/runtime/steps/test_finite.py"
smoke_parts=(
    "gpu-tests|220|env BATCHFIT_TEST_DEADLINE=180 BATCHFIT_TEST_FIRST=$NEVER_RUN $py -m pytest -p no:cacheprovider -q -rA --junitxml=$out/smoke-gpu-tests.xml --durations=0 -m gpu $GPU_TEST_FILES"
    "adapters|70|env BATCHFIT_TEST_FIRST=$NEVER_RUN $py -m pytest -p no:cacheprovider -q -rA --junitxml=$out/smoke-adapters.xml -m gpu tests/integrations"
    "main-command|30|$py bench/transcript.py --json $out/transcript-cuda-find-transformer.json -- $py -m batchfit find --example transformer --memory-limit 2GiB --modes train,eval --device cuda:0"
    "find-builtins|70|$py bench/find.py --device cuda --no-competitors --workloads cnn,transformer --json $out/find-cuda-smoke-builtins.json"
    "find-resnet50-amp|60|$py bench/find.py --device cuda --no-competitors --window 0 --workloads resnet50-amp --json $out/find-cuda-smoke-resnet50-amp.json"
)
if [ "$plan" = 1 ]; then
    for stage in "$@"; do
        [ "$stage" = smoke ] || { echo "gpu_session: --plan covers the smoke alone, not '$stage'" >&2; exit 2; }
    done
    echo "smoke: at most $SMOKE_SECONDS s"
    for part in "${smoke_parts[@]}"; do
        IFS='|' read -r part_name seconds command <<<"$part"
        echo "$part_name $seconds s: $command"
    done
    exit 0
fi
mkdir -p "$out"
if compgen -G ".whl/*.whl" >/dev/null; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl ||
        exit 1
    export PYTHONPATH=/tmp/site:$PWD/src${PYTHONPATH:+:$PYTHONPATH}
else
    export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
fi
if ! "$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu_session: torch sees no CUDA device here; these stages need one" >&2
    exit 1
fi
if ! "$py" -c "import batchfit" 2>"$out/import.log"; then
    tail -n 1 "$out/import.log" >&2
    echo "gpu_session: batchfit does not import; a missing dependency (omegaconf: ../shared/tools/gpu-wheels.sh) goes in .whl/ as a wheel" >&2
    exit 1
fi
rm -f "$out/import.log"
"$py" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda, torch.cuda.get_device_name())"
status=0
for stage in "$@"; do
    echo "== $stage"
    started=$SECONDS
    name=${stage%%:*}
    only=()
    suffix=""
    if [[ $stage == *:* ]]; then
        only=(--workloads "${stage#*:}")
        [ "$name" = explore ] && only=(--examples "${stage#*:}")
        suffix="-${stage#*:}"
        suffix=${suffix//,/-}  # the device tool brings back names of letters, digits, ., _ and - only
    fi
    case $name in
    smoke)
        git rev-parse HEAD >/dev/null 2>&1 || [ -n "${BATCHFIT_COMMIT:-}" ] ||
            echo "gpu_session: not a git checkout and no BATCHFIT_COMMIT: the results files record the package's version alone"
        failed=0
        for part in "${smoke_parts[@]}"; do
            IFS='|' read -r part_name seconds command <<<"$part"
            began=$SECONDS
            echo "-- $part_name (budget $seconds s): $command"
            rm -f "$out/smoke-$part_name.xml"  # a report from an earlier run is not this one's
            # shellcheck disable=SC2086  # the command's words, as planned
            timeout --kill-after=10 "$seconds" $command 2>&1 | tee "$out/smoke-$part_name.log" | tail -n 40
            code=${PIPESTATUS[0]}
            [ "$code" -eq 124 ] && echo "-- $part_name: over its budget of $seconds s, stopped"
            if [ -f "$out/smoke-$part_name.xml" ]; then  # each test's outcome, skipped ones as skipped
                "$py" bench/junit_outcomes.py "$out/smoke-$part_name.xml" >"$out/smoke-$part_name-outcomes.txt"
                tested=$?
                echo "-- $part_name: $(head -n 1 "$out/smoke-$part_name-outcomes.txt")"
                [ "$code" -eq 0 ] && [ "$tested" -ne 0 ] && code=$tested
            fi
            [ "$code" -ne 0 ] && failed=$code
            echo "-- $part_name: exit $code after $((SECONDS - began)) s"
        done
        (exit "$failed") ;;
    gpu-tests) BATCHFIT_TEST_FIRST=$NEVER_RUN "$py" -m pytest -p no:cacheprovider -q -rA \
        --junitxml="$out/gpu-tests.xml" -m gpu 2>&1 | tee "$out/gpu-tests.log" ;;
    tests)
        parallel=()
        "$py" -c "import xdist" 2>/dev/null && parallel=(-n 5 -m "not gpu and not slow")
        "$py" -m pytest -p no:cacheprovider -q "${parallel[@]}" 2>&1 | tee "$out/tests.log" | tail -n 60 ;;
    find) "$py" bench/find.py --device cuda "${only[@]}" --json "$out/find-cuda$suffix.json" 2>&1 |
        tee "$out/find$suffix.log" ;;
    expandable) # the truth on one model per case, for the workloads whose answers failed 20 steps
        # on the H200 with the setting (h200-2026-11-26), then CUDA's allocator history of each under
        # it: where its tensors sit in the pools' pages (bench/expandable_agreement.py starts from
        # the default allocator's, packed, which places no model built after another)
        workloads=mlp,cnn,transformer,resnet50-amp
        [[ $stage == *:* ]] && workloads=${stage#*:}
        { PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$py" bench/find.py --device cuda \
            --workloads "$workloads" --json "$out/find-cuda-expandable$suffix.json"
            code=$?
            for workload in ${workloads//,/ }; do
                PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "$py" bench/allocator_history.py --device cuda \
                    --workload "$workload" --json "$out/allocator-history-cuda-expandable-$workload.json" || code=$?
            done
            exit "$code"; } 2>&1 | tee "$out/find-expandable$suffix.log" ;;
    curves) # recorded, then replayed at once: find's search on those trials, beside Lightning's,
        # with the opening's allocator requests replayed and without (how well the model forecasts CUDA)
        recorded="$out/find-curves-cuda$suffix.json"
        { "$py" bench/find_curves.py --device cuda "${only[@]}" --json "$recorded" &&
            "$py" bench/find_replay.py "$recorded" &&
            "$py" bench/find_replay.py "$recorded" --no-forecast; } 2>&1 | tee "$out/curves$suffix.log" ;;
    explore) "$py" bench/explore.py --device cuda "${only[@]}" --json "$out/explore-cuda$suffix.json" 2>&1 |
        tee "$out/explore$suffix.log" ;;
    compare) "$py" bench/compare.py --device cuda "${only[@]}" --json "$out/compare-cuda$suffix.json" 2>&1 |
        tee "$out/compare$suffix.log" ;;
    predict) # the benchmark, then the allocator histories of the same workloads
        histories=resnet50,resnet50-amp,vit-b16,gpt2,mlp,cnn,transformer
        [[ $stage == *:* ]] && histories=${stage#*:}
        { "$py" bench/predict.py --device cuda "${only[@]}" --json "$out/predict-cuda$suffix.json"
            code=$?
            for workload in ${histories//,/ }; do
                "$py" bench/allocator_history.py --device cuda --workload "$workload" \
                    --json "$out/allocator-history-cuda-$workload.json" || code=$?
            done
            exit "$code"; } 2>&1 | tee "$out/predict$suffix.log" ;;
    advise)
        examples=cnn
        [[ $stage == *:* ]] && examples=${stage#*:}
        failed=0
        for example in ${examples//,/ }; do
            limit=1GiB
            [ "$example" = transformer ] && limit=2GiB
            began=$SECONDS
            "$py" -m batchfit advise --example "$example" --device cuda --memory-limit "$limit" \
                --format json >"$out/advise-cuda-$example.json" 2>"$out/advise-$example.log"
            code=$?
            [ "$code" -ne 0 ] && failed=$code
            tail -n 12 "$out/advise-$example.log"
            echo "advise $example at $limit: exit $code after $((SECONDS - began)) s" | tee -a "$out/advise-$example.log"
        done
        (exit "$failed") ;;
    esac
    code=${PIPESTATUS[0]}
    echo "== $stage: exit $code after $((SECONDS - started)) s"
    [ "$code" -ne 0 ] && status=$code
done
exit "$status"
