"""The run's files at a checkpoint: which log lengths belong to it, finishing an interrupted swap, and cutting
the logs back to it before a resume. `Runtime.checkpoint` (`laminar.runtime.launch`) writes the checkpoint
itself: the trainer's files, then `RUNTIME_STATE` with the pools, the buffer and these log lengths."""

from __future__ import annotations

import shutil
from pathlib import Path

from laminar.trainer.state_files import read_json

RUNTIME_STATE = "runtime_state.json"  # the run's pools and counters beside the trainer's files

LOGS = ("metrics.jsonl", "trajectories.jsonl")  # append-only run logs, rewound to a checkpoint on resume


def log_sizes(run_dir: Path) -> dict[str, int]:
    """How long each run log is now: everything up to here belongs to the checkpoint being written."""
    return {name: (run_dir / name).stat().st_size if (run_dir / name).exists() else 0 for name in LOGS}


def finish_checkpoint_swap(checkpoint: Path) -> None:
    """A kill between the two renames of `Runtime.checkpoint` leaves only `checkpoint.old`: take it back; a kill
    after them leaves both: the old one goes."""
    old = checkpoint.with_name(checkpoint.name + ".old")
    if not checkpoint.exists() and old.exists():
        old.rename(checkpoint)
    elif old.exists():  # stopped after the new one was in place, before the old one was deleted
        shutil.rmtree(old, ignore_errors=True)


def rewind_to_checkpoint(run_dir: Path, checkpoint: Path) -> dict[str, int]:
    """Before a resume: the run logs end where the checkpoint was taken. What was logged after it (steps the
    resumed run trains again) moves to `NAME.rolled-back` beside the log, so nothing is counted twice and
    nothing is thrown away."""
    sizes = read_json(checkpoint / RUNTIME_STATE, "prompt pool, buffer and in-flight frontier").get(
        "logs", {}
    )
    moved = {}
    for name in LOGS:
        log, keep = run_dir / name, int(sizes.get(name, 0))
        if not log.exists() or log.stat().st_size <= keep:
            continue
        with open(log, "rb+") as f:
            f.seek(keep)
            tail = f.read()
            with open(run_dir / f"{name}.rolled-back", "ab") as dump:
                dump.write(tail)
            f.truncate(keep)
        moved[name] = len(tail)
    return moved
