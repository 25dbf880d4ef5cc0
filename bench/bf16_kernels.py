"""One training step in float32 and under bf16 autocast, with this CPU's oneDNN bfloat16 kernels
and without them (``ONEDNN_MAX_CPU_ISA=AVX2``, set before torch loads, in a child process): what a
test that trains under autocast pays on a CPU that lacks the kernels (docs/benchmarks.md, "The
suite on a CPU without bfloat16 kernels").

Run (CPU only, about 20 s): ``python bench/bf16_kernels.py [--json F]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import _harness
import torch
from torch import nn

DEFAULT_JSON = "bench/data/cpu-2026-12-08/bf16-kernels.json"
CAPPED_ISA = "AVX2"
TIMED_STEPS = 3  # after one warm-up step, on one thread


def conv_net() -> tuple[nn.Module, torch.Tensor]:
    """A 3-layer conv net on 16 images of 3x32x32."""
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.ReLU(),
        nn.Conv2d(64, 64, 3, padding=1),
        nn.ReLU(),
        nn.Flatten(),
        nn.Linear(64 * 32 * 32, 10),
    )
    return model, torch.randn(16, 3, 32, 32)


def mlp() -> tuple[nn.Module, torch.Tensor]:
    """A 512-2048-512 MLP on 64 samples."""
    model = nn.Sequential(
        nn.Linear(512, 2048), nn.ReLU(), nn.Linear(2048, 512), nn.ReLU(), nn.Linear(512, 10)
    )
    return model, torch.randn(64, 512)


MODELS = {"conv net": conv_net, "MLP": mlp}


def step_seconds(build: str, autocast: bool) -> float:
    """The mean seconds of one SGD step of ``MODELS[build]``, float32 or under bf16 autocast."""
    torch.manual_seed(0)
    model, inputs = MODELS[build]()
    labels = torch.randint(0, 10, (inputs.shape[0],))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(model(inputs), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()

    step()
    started = time.perf_counter()
    for _ in range(TIMED_STEPS):
        step()
    return (time.perf_counter() - started) / TIMED_STEPS


def measured_here() -> dict[str, Any]:
    """Every model's float32 and bf16 step in this process, and whether oneDNN has bf16 kernels."""
    torch.set_num_threads(1)
    return {
        "bf16_kernels": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported()),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "seconds": {
            name: {"float32": step_seconds(name, False), "bf16": step_seconds(name, True)} for name in MODELS
        },
    }


def measured_capped() -> dict[str, Any]:
    """``measured_here`` in a child process whose oneDNN is capped at ``CAPPED_ISA``."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": CAPPED_ISA}
    child = subprocess.run(
        [sys.executable, __file__, "--child"], env=env, capture_output=True, text=True, check=True
    )
    measured: dict[str, Any] = json.loads(child.stdout)
    return measured


def main(argv: list[str] | None = None) -> None:
    args, session = _harness.start(
        __doc__, argv, quick="no effect: the run is already short", json_default=DEFAULT_JSON
    )
    here, capped = measured_here(), measured_capped()
    rows = [
        {
            "model": name,
            "float32_seconds": here["seconds"][name]["float32"],
            "bf16_seconds": here["seconds"][name]["bf16"],
            "bf16_capped_seconds": capped["seconds"][name]["bf16"],
            "capped_over_float32": capped["seconds"][name]["bf16"] / here["seconds"][name]["float32"],
        }
        for name in MODELS
    ]
    for row in rows:
        print(
            f"{row['model']:>8}: float32 {row['float32_seconds']:.3f} s, bf16 {row['bf16_seconds']:.3f} s, "
            f"bf16 with ONEDNN_MAX_CPU_ISA={CAPPED_ISA} {row['bf16_capped_seconds']:.3f} s "
            f"({row['capped_over_float32']:.1f}x float32)"
        )
    print(f"bf16 kernels: {here['bf16_kernels']} here, {capped['bf16_kernels']} capped")
    payload = {
        "capped_isa": CAPPED_ISA,
        "timed_steps": TIMED_STEPS,
        "here": here,
        "capped": capped,
        "rows": rows,
    }
    _harness.save(args, session, _harness.ROOT / DEFAULT_JSON, payload)


if __name__ == "__main__":
    if sys.argv[1:] == ["--child"]:
        print(json.dumps(measured_here()))
    else:
        main()
