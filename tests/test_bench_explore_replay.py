"""The replay of explore on recorded curves (bench/explore_replay.py): the real explore against a
model of the machine, so it must track explore's own calls and leave it as it was."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

# bench/ is a directory of scripts, not a package: its directory goes on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import explore_replay as replay_tool

KNEE = {1: 100.0, 2: 190.0, 4: 350.0, 8: 600.0, 16: 960.0, 32: 1000.0, 64: 1010.0}


def quiet_curve() -> replay_tool.Curve:
    """A knee with no noise and no drift: windows read the truth exactly."""
    return replay_tool.Curve(
        name="knee",
        max_batch=64,
        tokens=1,
        sizes=sorted(KNEE),
        level={batch: math.log(value) for batch, value in KNEE.items()},
        residuals={batch: [0.0] for batch in KNEE},
        drift=[0.0],
        pass_seconds=1.0,
    )


def test_without_noise_explore_finds_the_rule_s_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(replay_tool, "UNMEASURED_BUMP", 0.0)  # unmeasured sizes on the line
    curve = quiet_curve()
    meter, clock = replay_tool.explore_module._Meter, replay_tool.explore_module.time
    result = replay_tool.replay(curve, seed=0)
    # explore is left as it was.
    assert replay_tool.explore_module._Meter is meter and replay_tool.explore_module.time is clock
    # 32 is within 3% of 64; explore refines below it (24, on the line between 16 and 32 at 0.973
    # of the best, also within) and takes the smallest that is, confidently.
    assert result.pick == 24 and result.quality == pytest.approx(math.exp(curve.log_rate(24)) / 1010.0)
    assert result.stop_reason == "confident" and result.confidence >= 90
    # The modelled time: a fraction of the modelled sweep's, which counts every sweep size.
    assert 0 < result.time_ratio < 1
    sweep = sum((1 + 10 * 3) * batch / value for batch, value in KNEE.items())
    assert curve.sweep_seconds() == pytest.approx(sweep)


def test_a_recorded_run_replays() -> None:
    # The cnn row of a full benchmark run (bench/results/ is not in the repository).
    recorded = json.loads((Path(__file__).parent / "data" / "explore_bench_cnn.json").read_text())
    row = next(row for row in recorded["rows"] if row["example"] == "cnn")
    curve = replay_tool.Curve.from_row(row, "recorded")
    # The truth is the benchmark's: the level of its median polish at each sweep size.
    for batch, point in row["sweep"]["points"].items():
        assert math.exp(curve.level[int(batch)]) == pytest.approx(point["level"])
    assert len(curve.drift) == recorded["truth_windows"] and curve.pass_seconds > 0
    results = [replay_tool.replay(curve, seed) for seed in range(3)]
    assert all(1 <= r.pick <= curve.max_batch and 0 < r.quality <= 1 and r.time_ratio > 0 for r in results)


def test_a_replay_reads_no_real_clock() -> None:
    # Every clock explore reads is the model's: the same seed gives the same replay to the bit,
    # however loaded the machine is (a real clock made the stop reason depend on the load).
    recorded = json.loads((Path(__file__).parent / "data" / "explore_bench_cnn.json").read_text())
    curve = replay_tool.Curve.from_row(next(r for r in recorded["rows"] if r["example"] == "cnn"), "rec")
    first, again = replay_tool.replay(curve, seed=5), replay_tool.replay(curve, seed=5)
    assert first == again
