"""The tables of the allocator's model against CUDA's recordings: bench/allocator_history.py's traces,
bench/predict_histories.py's replays, bench/expandable_agreement.py's points and
bench/transient_requests.py's requests."""

from __future__ import annotations

from typing import Any

from _tables_base import markdown, provenance


def allocator_history_table(files: list[dict[str, Any]]) -> str:
    """``bench/allocator_history.py``: each recorded trial's trace (entries, the segments CUDA
    allocated and freed), its peak allocated and what its segments held at the end."""
    lines = []
    for data in files:
        for trial in data["trials"]:
            actions = [entry.split(" ", 1)[0] for entry in trial["entries"]]
            reserved = sum(segment["total_size"] for segment in trial["segments_at_end"])
            lines.append(
                [
                    data["workload"],
                    str(trial["batch_size"]),
                    f"{len(actions)}{' (oldest dropped)' if trial['dropped'] else ''}",
                    str(actions.count("segment_alloc")),
                    str(actions.count("segment_free")),
                    f"{trial['peak_allocated_bytes'] / 2**20:.1f}",
                    f"{reserved / 2**20:.1f}",
                ]
            )
    headers = ["workload", "batch", "trace entries", "segments allocated", "segments freed"]
    headers += ["peak allocated (MiB)", "reserved at the end (MiB)"]
    said = "\n".join(f"- {provenance(data)}" for data in files)
    return f"{markdown(headers, lines, (0,))}\n\n{said}"


def _mib_error(value: int, truth: int) -> str:
    return f"{(value - truth) / 2**20:+.1f} ({(value - truth) / truth:+.1%})"


def predict_histories_table(files: list[dict[str, Any]]) -> str:
    """``bench/predict_histories.py``: CUDA's recorded trials on the model of its allocator, the
    replay of batch 2 and 4 at 8, and the CPU alone at 2, 4 and 8, each beside CUDA's figures."""
    (data,) = files
    tables = [_histories_model(data), _histories_replay(data), _histories_cpu_alone(data)]
    skipped = "\n".join(
        f"- not from the CPU alone: {name}: {why}" for name, why in data["cpu_alone_skipped"].items()
    )
    return "\n\n".join([*tables, skipped, provenance(data)])


def _histories_model(data: dict[str, Any]) -> str:
    """Each recorded trial's segments, reserved and peak allocated bytes, on CUDA and on the model."""
    model = []
    for row in data["model"]:
        alike = f"{row['placed_alike']}/{row['requests']}"
        model.append(
            [
                row["workload"],
                str(row["batch_size"]),
                f"{len(row['cuda_segments'])} / {len(row['model_segments'])}",
                f"{row['cuda_reserved_bytes'] / 2**20:.1f}",
                f"{row['model_reserved_bytes'] / 2**20:.1f}",
                _mib_error(row["model_reserved_bytes"], row["cuda_reserved_bytes"]),
                f"{row['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                f"{row['model_peak_allocated_bytes'] / 2**20:.1f}",
                alike,
            ]
        )
    headers = ["workload", "batch", "segments taken (CUDA / model)", "reserved, CUDA (MiB)", "model (MiB)"]
    headers += ["error (MiB)", "peak allocated, CUDA (MiB)", "model (MiB)", "requests placed alike"]
    return markdown(headers, model, (0, 2))


def _histories_replay(data: dict[str, Any]) -> str:
    """The replay of batch 2 and 4 at 8 beside CUDA's figures at 8, its error also in samples."""
    replay = []
    for row in data["replay"]:
        if not row["aligned"]:
            replay.append([row["workload"], *["-"] * 6, "not aligned: " + str(row["events"])])
            continue
        four = next(r for r in data["model"] if r["workload"] == row["workload"] and r["batch_size"] == 4)
        per_sample = (row["cuda_peak_allocated_bytes"] - four["cuda_peak_allocated_bytes"]) / 4
        error = row["replay_peak_allocated_bytes"] - row["cuda_peak_allocated_bytes"]
        samples = f"{error / per_sample:+.2f}" if per_sample > 2**20 else "-"
        replay.append(
            [
                row["workload"],
                f"{row['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                _mib_error(row["replay_peak_allocated_bytes"], row["cuda_peak_allocated_bytes"]),
                f"{row['cuda_reserved_bytes'] / 2**20:.1f}",
                _mib_error(row["replay_peak_reserved_bytes"], row["cuda_reserved_bytes"]),
                f"{per_sample / 2**20:.1f}",
                samples,
                str(row["largest_under_cuda_reserved_at_8"]),
            ]
        )
    headers = [
        "workload",
        "peak allocated at 8, CUDA (MiB)",
        "replay's error (MiB)",
        "reserved at 8, CUDA (MiB)",
    ]
    headers += ["replay's error (MiB)", "CUDA's MiB a sample (4 to 8)", "allocated error in samples"]
    headers += ["largest placed under CUDA's reserved at 8"]
    return markdown(headers, replay, (0, 7))


def _histories_cpu_alone(data: dict[str, Any]) -> str:
    """The CPU alone's peak allocated and reserved bytes at each size beside CUDA's."""
    alone = []
    for row in data["cpu_alone"]:
        for point in row["points"]:
            alone.append(
                [
                    row["workload"],
                    str(point["batch_size"]),
                    f"{point['cuda_peak_allocated_bytes'] / 2**20:.1f}",
                    _mib_error(point["cpu_peak_allocated_bytes"], point["cuda_peak_allocated_bytes"]),
                    f"{point['cuda_reserved_bytes'] / 2**20:.1f}",
                    _mib_error(point["cpu_peak_reserved_bytes"], point["cuda_reserved_bytes"]),
                ]
            )
    headers = ["workload", "batch", "peak allocated, CUDA (MiB)", "CPU alone's error (MiB)"]
    headers += ["reserved, CUDA (MiB)", "CPU alone's error (MiB)"]
    return markdown(headers, alone, (0,))


def expandable_agreement_table(files: list[dict[str, Any]]) -> str:
    """``bench/expandable_agreement.py``: per row of the H200's expandable-segments file, the points
    the model agrees with on each model instance, its largest size, the H200's own contradictions
    and where the resident state must sit for the model to agree with the truth and the checks."""
    (data,) = files
    lines = [_expandable_line(row) for row in data["rows"]]
    total = data["summary"]
    headers = ["workload", "cap (MiB)", "agree", "truth and checks agree"]
    headers += ["with what each instance held beyond the replay", "held beyond (MiB)"]
    headers += ["disagree at (H200's verdict)"]
    headers += ["model's largest (10 / 20 steps)", "its step of failure, by cap (MiB from the row's)"]
    headers += ["the same, default allocator", "H200 pairs no one start gives"]
    headers += ["offsets that agree with truth and checks (MiB)", "fits 20 steps at every offset"]
    said = (
        f"In all: {total['agreeing']} of {total['points']} points agree, {total['judged_agreeing']} of "
        f"{total['judged']} truth probes and checks ({total['judged_agreeing_with_unrecorded']} with "
        "what each instance held beyond the replay); the model's verdict at 20 steps differs from its "
        f"verdict at 10 at {total['steps_matter']} points; {total['contradictions']} pairs of the H200's "
        "verdicts on two instances cannot both come from one start. Replayed at caps around each row's for "
        f"up to {data['settling_steps']} steps, the largest size that trains 10 fails at step "
        f"{total['latest_failure_step']['True'] or '-'} at the latest with expandable segments, "
        f"{total['latest_failure_step']['False'] or 'never'} with the default allocator "
        "('-': it trains them all; n/a: no size within 16 of the model's answer at the row's cap trains 10)."
    )
    return f"{markdown(headers, lines, (0, 5, 6, 8, 9, 10, 11))}\n\n{said}\n\n{provenance(data)}"


def _expandable_line(row: dict[str, Any]) -> list[str]:
    """A row's agreement, what it disagrees at, the model's largest size and step of failure by cap,
    the H200's contradictions and the offsets that agree."""
    missed = [p for p in row["points"] if p["model"] != p["fits"]]
    disagree = "; ".join(
        f"{p['who']} {p['size']} x {p['steps']} ({'fits' if p['fits'] else 'fails'})" for p in missed
    )
    widest = row["contradictions"][0] if row["contradictions"] else None
    contradiction = (
        "-"
        if widest is None
        else (
            f"{len(row['contradictions'])}; widest: {widest[0]} {widest[1]} x {widest[2]} fits, "
            f"{widest[3]} {widest[4]} x {widest[5]} fails"
        )
    )
    largest = row["model_largest"]
    settled = [
        ", ".join(
            f"{s['cap_mib_from_row']:+d}: {'n/a' if s['largest'] is None else s['fails_at_step'] or '-'}"
            for s in row["settling"]
            if s["expandable"] == expandable
        )
        for expandable in (True, False)
    ]
    gaps = ", ".join(map(str, row["agreeing_gaps_mib"])) or "none"
    held = {f"{nbytes / 2**20:.1f}" for nbytes in row["unrecorded_bytes"].values() if nbytes}
    unrecorded = ", ".join(
        f"{who} {nbytes / 2**20:.1f}" for who, nbytes in row["unrecorded_bytes"].items() if nbytes
    )
    return [
        row["workload"],
        f"{row['cap_bytes'] / 2**20:.1f}",
        f"{row['agreeing']}/{len(row['points'])}",
        f"{row['judged_agreeing']}/{row['judged']}",
        f"{row['judged_agreeing_with_unrecorded']}/{row['judged']}" if held else "-",
        unrecorded or "-",
        disagree or "-",
        f"{largest['10']} / {largest['20']}",
        *settled,
        contradiction,
        gaps,
        str(row["largest_at_every_gap"] or "none"),
    ]


def transient_requests_table(files: list[dict[str, Any]]) -> str:
    """``bench/transient_requests.py``: per recorded CUDA trial, the requests freed before the next."""
    (data,) = files
    lines = [
        [
            row["workload"],
            str(row["batch_size"]),
            str(row["requests"]),
            str(row["transient"]),
            f"{row['largest_bytes'] / 2**20:.1f}",
            f"{row['total_bytes'] / 2**20:.0f}",
        ]
        for row in data["rows"]
    ]
    headers = [
        "workload",
        "batch",
        "requests (2 steps)",
        "freed before the next",
        "largest (MiB)",
        "in all (MiB)",
    ]
    return f"{markdown(headers, lines, (0,))}\n\n{provenance(data)}"
