"""The lockstep search on real 2-process gloo groups: every rank agrees, and a failure on one rank
ends every rank within seconds (marker ``distributed``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lockstep_workers
import pytest
import torch
from tiny_workloads import build, classification_batch, large_batch_workspace
from two_ranks import run_ranks

from batchfit import BatchSizes, find_batch_size
from batchfit.runtime.devices.caching_device import CachingCpuDevice
from batchfit.search.find_batch_size import find_on
from batchfit.where import ResolvedDevice

pytestmark = pytest.mark.distributed


def spawn(scenario: str, limits: list[str], tmp_path: Path) -> list[dict[str, Any]]:
    """Run ``scenario`` on two real ranks; their reports (index = rank). Fails on a hang."""
    run_ranks(
        lockstep_workers.main,
        (str(tmp_path / "store"), scenario, limits, str(tmp_path)),
        "the lockstep search",
    )
    return [json.loads((tmp_path / f"{rank}.json").read_text()) for rank in range(2)]


def test_ranks_with_different_capacities_agree_on_the_smaller_one(tmp_path: Path) -> None:
    # Rank 0 plays a 3 MiB device, rank 1 a 6 MiB one: rank 0 runs out of memory where rank 1
    # does not, and both return the answer of a single process at 3 MiB, from the same trials.
    reports = spawn("capacities", ["3MiB", "6MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    alone = find_batch_size(
        build("mlp", "sgd"), device="cpu", memory_limit="3MiB", sizes=BatchSizes(max_batch_size=4096)
    )
    assert reports[0]["batch_size"] == reports[1]["batch_size"] == alone.batch_size
    assert reports[0]["budget_bytes"] == reports[1]["budget_bytes"] == alone.budget_bytes
    assert reports[0]["trials"] == reports[1]["trials"]
    assert reports[0]["outcomes"] == reports[1]["outcomes"]
    pairs = zip(reports[0]["outcomes"], reports[0]["details"], strict=True)
    failed = [detail for outcome, detail in pairs if outcome != "ok"]
    assert failed and all(detail.startswith("rank 0: ") for detail in failed)


def test_ranks_ask_a_failed_forecast_again_together(tmp_path: Path) -> None:
    # The replay's answer fails, a size below it fits, and the forecast is asked again on that
    # trial's records: whether to ask is every rank's evidence at once (a collective), so the
    # ranks place the same trials as one process does, and none waits on another.
    reports = spawn("caching-revised", ["40MiB", "40MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    alone = find_on(
        ResolvedDevice(CachingCpuDevice(40 * 2**20), 0.8),
        large_batch_workspace(1500),
        "train",
        BatchSizes(max_batch_size=8192),
    )
    assert reports[0]["trials"] == reports[1]["trials"] == [t.batch_size for t in alone.trials]
    assert reports[0]["batch_size"] == alone.batch_size < alone.trials[2].batch_size  # it overshot


def test_behind_caching_allocators_every_rank_places_its_trials_by_the_replay_of_all(tmp_path: Path) -> None:
    # Each rank replays its own opening's allocator requests: rank 1's step makes other requests
    # (larger images; alone, under the same budget, the two answer 85 and 113: segment sizes, not
    # bytes, decide there). A size fits where it fits both, so both place the same trials: 2, 4,
    # the smaller answer, and the next.
    reports = spawn("caching", ["32MiB", "48MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    alone = []
    for image in ((3, 16, 16), (3, 24, 24)):
        workload = build("cnn", "sgd")
        workload.make_batch = classification_batch(image)
        # Every rank's trials run under the smallest rank's budget (0.8 of 32 MiB).
        alone.append(
            find_on(
                ResolvedDevice(CachingCpuDevice(32 * 2**20), 0.8),
                workload,
                "train",
                sizes=BatchSizes(max_batch_size=4096),
            )
        )
    answer = min(result.batch_size for result in alone)
    assert alone[0].batch_size != alone[1].batch_size  # the ranks' own replays disagree
    assert reports[0]["trials"] == reports[1]["trials"] == [2, 4, answer, answer + 1]
    assert reports[0]["batch_size"] == reports[1]["batch_size"] == answer
    assert reports[0]["replays"] == reports[1]["replays"] > 0


@pytest.mark.parametrize(
    ("scenario", "error"), [("value-error", "ValueError"), ("interrupt", "KeyboardInterrupt")]
)
def test_an_error_on_one_rank_stops_every_rank(scenario: str, error: str, tmp_path: Path) -> None:
    # Rank 1's step raises in its third real step (its second trial) while rank 0 runs the same
    # trial. Both end after it: rank 1 with its own error, rank 0 with RankFailedError naming rank 1
    # and the error.
    reports = spawn(scenario, ["6MiB", "6MiB"], tmp_path)
    assert reports[1]["error"] == error
    assert any("on rank 1 of 2" in note for note in reports[1]["notes"])
    assert reports[0]["error"] == "RankFailedError"
    assert reports[0]["message"].startswith(f"rank 1 of 2 raised {error}")
    assert all(report["seconds"] < 20 for report in reports), reports


def test_explore_on_ranks_with_different_capacities_measures_the_same_points(tmp_path: Path) -> None:
    # The bound is the lockstep find's answer at the smaller device; each window's throughput is
    # the slower rank's, and the stop is read on rank 0's clock: the ranks end with equal results.
    reports = spawn("explore", ["3MiB", "6MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    alone = find_batch_size(build("mlp", "sgd"), device="cpu", memory_limit="3MiB")
    assert reports[0]["max_batch_size"] == reports[1]["max_batch_size"] == alone.batch_size
    for key in ("points", "recommendation", "stop_reason"):
        assert reports[0][key] == reports[1][key], key


def test_analyze_on_ranks_with_different_capacities_matches_one_process_at_the_smaller(
    tmp_path: Path,
) -> None:
    reports = spawn("analyze", ["3MiB", "6MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    alone = lockstep_workers.analyze_report(build("mlp", "sgd"), "3MiB")
    assert reports[0]["rows"] == reports[1]["rows"] == alone["rows"]
    assert reports[0]["trials_run"] == reports[1]["trials_run"]


def test_compare_on_ranks_with_different_capacities_gives_every_rank_the_same_rows(tmp_path: Path) -> None:
    # The searches run in lockstep and the timing rounds read the slower rank: equal rows, whose
    # largest batches are one process's at the smaller capacity.
    reports = spawn("compare", ["3MiB", "6MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    mine, theirs = (
        [(r["technique"], r["batch_size"], r["samples_per_second"]) for r in report["rows"]]
        for report in reports
    )
    assert mine == theirs
    alone = find_batch_size(build("mlp", "sgd"), device="cpu", memory_limit="3MiB")
    assert mine[0][:2] == ("baseline", alone.batch_size)
    assert [technique for technique, _, _ in mine] == ["baseline", "amp", "accumulation"]


@pytest.fixture(scope="module")
def ddp_reports(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return spawn("ddp", ["4MiB", "4MiB"], tmp_path_factory.mktemp("ddp"))


def test_a_model_in_ddp_is_searched_with_its_gradient_buckets_and_its_answer_trains_in_ddp(
    ddp_reports: list[dict[str, Any]],
) -> None:
    # Each rank passes its MLP wrapped in DistributedDataParallel. The trials run the module (no
    # all-reduce to wait in) with DDP's buckets resident; the answer is the truth of DDP training
    # by force, its buckets allocated inside the cap: it trains with its all-reduces, the next
    # size does not. Unwrapped, the same search says more, which DDP training cannot hold.
    assert all("error" not in report for report in ddp_reports), ddp_reports
    first, second = ddp_reports
    assert first["batch_size"] == second["batch_size"] and first["trials"] == second["trials"]
    # The fake-tensor forecast holds the buckets too: it places the answer and the next first.
    assert first["trials"] == [first["batch_size"], first["batch_size"] + 1]
    assert first["by_force"] == [True, False]
    assert first["unwrapped_batch_size"] > first["batch_size"]
    # With CUDA's allocator modelled, the buckets are a block held from trial to trial: the search
    # runs the trials it runs with a tensor of their bytes allocated before it, not those without.
    behind, held, plain = first["caching"]
    assert behind == held and behind[-2] < plain[-2]


def test_a_train_step_written_for_ddp_runs_in_the_trials_and_its_answer_trains_in_ddp(
    ddp_reports: list[dict[str, Any]],
) -> None:
    # It accumulates over two micro-batches with DDP's no_sync and reads model.module: a trial
    # gives it a stand-in with DDP's interface and no collective (before, the DDP's module,
    # which has neither: AttributeError). By force, in DDP with its all-reduce, the answer trains
    # and the next size does not.
    first, second = (report["accumulated"] for report in ddp_reports)
    assert first == second and first[1:] == [True, False]


def test_ranks_that_search_a_plain_model_are_told_once_to_pass_the_wrapped_one(
    ddp_reports: list[dict[str, Any]],
) -> None:
    # The plain MLP was searched twice (the capped CPU, the modelled allocator); the DDP not warned.
    told = (
        "2 ranks search a model that is not wrapped in DistributedDataParallel; if training wraps it, "
        "pass the wrapped model (Workload(model=DistributedDataParallel(model), ...)): DDP holds "
        "gradient buckets of 332.04 KiB beside it, which this search does not count."
    )
    assert ddp_reports[0]["told"] == [told]


def test_cap_memory_counts_the_buckets_of_a_ddp_built_before_it(ddp_reports: list[dict[str, Any]]) -> None:
    # DDP training under batchfit.cap_memory: built inside the block, its buckets are the block's
    # allocations; built before it, they count from the first backward, which writes into them
    # (counted as held as well, they counted twice). The same peak either way.
    # (Within a few bytes: the tracker counts a scalar that DDP's all-reduce makes where the
    # thread that completes it is this one, and gloo's thread completes it in some runs.)
    built_inside, named = ddp_reports[0]["peaks"]
    assert abs(built_inside - named) < 1024 < ddp_reports[0]["wrapper_bytes"]


def test_the_result_says_what_ddp_holds_beside_the_model(ddp_reports: list[dict[str, Any]]) -> None:
    report = ddp_reports[0]
    assert report["wrapper_bytes"] == 340_008  # the MLP's 85,002 float32 parameters
    assert ", the smallest of 2 ranks, DDP's gradient buckets of 332.04 KiB held);" in report["summary"]
    assert (
        "The fixed part alone, parameters and buffers, takes 332.04 KiB (and DDP's gradient buckets "
        "332.04 KiB beside them) before gradients, optimizer state and activations."
    ) in report["too_small"]


def test_a_variant_of_the_workload_keeps_what_the_wrapper_holds(ddp_reports: list[dict[str, Any]]) -> None:
    # A fake copy of the module (the trace) or a compiled one (compare) stands in for the DDP's
    # module: the buckets are still held. A new model that is a DDP brings its own.
    assert ddp_reports[0]["replaced"] == [340_008, 340_008]


def test_ddp_s_buckets_are_counted_as_ddp_allocates_them(ddp_reports: list[dict[str, Any]]) -> None:
    # A frozen layer, a tied weight, a sparse embedding, a half-precision layer; and the same with
    # two parameters DDP is told to ignore: batchfit's count equals DDP's own account.
    if any(ddp_own is None for _, ddp_own in ddp_reports[0]["buckets"]):
        pytest.skip(f"torch {torch.__version__}: DDP is built without its broadcast (init_sync) from 2.5")
    for counted, ddp_own in ddp_reports[0]["buckets"]:
        assert counted == ddp_own
    assert ddp_reports[0]["buckets"][0][0] > ddp_reports[0]["buckets"][1][0]


def test_a_compiled_ddp_is_refused_with_what_to_pass(ddp_reports: list[dict[str, Any]]) -> None:
    assert ddp_reports[0]["refused"] == (
        "Workload.model is a torch.compile'd DistributedDataParallel, whose every step all-reduces "
        "across the ranks: a rank that ran out of memory inside a trial would leave the others "
        "waiting. Pass the DistributedDataParallel of the compiled module "
        "(DistributedDataParallel(torch.compile(model))): batchfit runs that module, compiled, and "
        "counts DDP's gradient buckets."
    )


@pytest.mark.gpu
def test_on_cuda_a_model_in_ddp_is_searched_with_the_buckets_its_allocator_holds(tmp_path: Path) -> None:
    # Both ranks on one GPU, gloo between them. The caching allocator holds DDP's one bucket; a
    # fresh DDP frees it in its second forward and allocates 3 (of at most 25 MiB past the first),
    # into the blocks step 1 left cached. The trials do that too, the new ones beside the old,
    # which they cannot free: the answer is below the unwrapped one, and it trains 10 steps in a
    # fresh DDP under the search's budget, built before the cap as a user builds it before find
    # (the cap empties the cache its construction left, as find's first trial does). Built inside
    # the cap, the blocks its broadcast freed stay cached: the report says whether that trains.
    # On the H200 of 2026-11-26, before the trials rebuilt the buckets: find 3584, DDP's own 3328.
    # 768 MiB: each rank's cuBLAS workspaces take about 64 MiB on an H200 (512 MiB: nothing fit).
    reports = spawn("ddp-cuda", ["768MiB", "768MiB"], tmp_path)
    assert all("error" not in report for report in reports), reports
    first = reports[0]
    # Where it does not train, each rank's report says what training did instead: each step's
    # peaks, its failure, DDP's own largest batch by force, and the unwrapped model beside the
    # buckets' bytes (what the search's trials hold) at the answer.
    # In full on stdout: pytest shortens an assertion's message, and a GPU run's log is all there is.
    print(json.dumps(reports, indent=1))
    assert first["by_force"] is True, [report.get("diagnosis") for report in reports]
    assert first["batch_size"] < first["unwrapped_batch_size"]
    # The trials rebuilt the buckets into what the fresh DDP rebuilt them into, and the result says so.
    assert first["rebuilt_buckets"] == first["steps_seen"]["ddp"]["rebuilt"] != ""
    assert "held and rebuilt into 3 buckets in step 2, as DDP does" in first["summary"]
