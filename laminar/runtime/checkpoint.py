"""A run's checkpoint: the trainer's files, then `RUNTIME_STATE` with the pools, the buffer and the run logs'
lengths (`write_checkpoint`); loading it back before any replica asks for work (`restore_checkpoint`);
finishing an interrupted swap, and cutting the logs back to it before a resume."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import ray

from laminar.jsonio import write_json
from laminar.trainer.lora import ADAPTER_DIR
from laminar.trainer.state_files import CheckpointError, read_json, verify_checkpoint

RUNTIME_STATE = "runtime_state.json"  # the run's pools and counters beside the trainer's files

# append-only run logs, rewound to a checkpoint on resume
LOGS = ("metrics.jsonl", "trajectories.jsonl", "samples.jsonl")


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


def write_checkpoint(rt: Any, path: Path) -> None:
    """Trainer state, then the prompt pool, the in-flight frontier and the buffer of the runtime `rt`, in that
    order: a group issued or a trajectory finished between two snapshots is then regenerated on resume and
    deduplicated by the buffer, never lost. Written beside `path` and swapped in, so a crash never leaves half
    of one."""
    tmp, old = path.with_name(path.name + ".tmp"), path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    t = rt.cfg.run.timeout_s
    rt.trainer.call("check_finite", timeout=t)  # never save NaN weights
    rt.trainer.call("save_checkpoint", str(tmp), timeout=t * 5)
    saved = rt.trainer.call("version", timeout=t)
    if saved != rt.version:  # interrupted between the trainer's step and our record of it
        shutil.rmtree(tmp, ignore_errors=True)
        raise RuntimeError(
            f"checkpoint skipped: the trainer is at version {saved} but the run recorded {rt.version}; "
            f"{path} keeps the last consistent checkpoint"
        )
    state = {
        "version": rt.version,
        "logs": log_sizes(rt.recorder.out_dir),
        "prompt_pool": ray.get(rt.prompt_pool.state_dict.remote(), timeout=t),
        "partial_pool": ray.get(rt.partial_pool.snapshot.remote(), timeout=t),
        "buffer": ray.get(rt.buffer.state_dict.remote(), timeout=t),
        "trained_ids": sorted(rt.trained_ids),
    }
    write_json(tmp / RUNTIME_STATE, state)
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)  # left by a run stopped between the last two steps below
        path.rename(old)
    tmp.rename(path)
    shutil.rmtree(old, ignore_errors=True)


def check_checkpoint(path: Path) -> None:
    """Before a resume starts anything: every file parses as data, the trainer's weights and optimizer moments
    are all there with the shapes its model's config implies (`verify_checkpoint`), and `RUNTIME_STATE` is in
    range (`check_runtime_state`). The first problem raises `CheckpointError`, one line."""
    verify_checkpoint(path, RUNTIME_STATE)
    check_runtime_state(path)


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _traj_group(tid: Any) -> int | None:
    """The group of a trajectory id as a checkpoint names it ("GROUP:SAMPLE"; an evaluation's group is
    negative), or None if it is not one."""
    group, sep, sample = tid.partition(":") if isinstance(tid, str) else ("", "", "")
    return int(group) if sep and group.removeprefix("-").isdigit() and sample.isdigit() else None


def check_runtime_state(path: Path) -> None:
    """`RUNTIME_STATE` as data: the version a non-negative integer and the trainer's own, the prompt pool's
    counters in range, and every group id it names issued. A prompt pool issues ids in order, one row drawn a
    group, so `next_group_id` is `epoch x num_rows + cursor`; and every group it issued is still named by the
    checkpoint (outstanding or queued in the pool, in flight, seen by the buffer or trained), so no id past the
    last one named was issued. A tampered id would otherwise send a resumed run and `laminar audit` counting
    through every number below it."""
    file = path / RUNTIME_STATE
    state = read_json(file, "prompt pool, buffer and in-flight frontier")

    def bad(field: str, value: Any, valid: str) -> CheckpointError:
        return CheckpointError(f"{file}: {field}={value!r:.80} is invalid: {valid}")

    if not isinstance(state, dict):
        raise bad("(the file)", type(state).__name__, "an object of fields, as `laminar train` writes it")
    trainer = read_json(path / "trainer_state.json", "trainer step, optimizer groups and RNG").get("version")
    version = state.get("version")
    if not _count(version) or version != trainer:
        raise bad(
            "version",
            version,
            f"a non-negative integer, the trainer's version (trainer_state.json: {trainer})",
        )
    logs = state.get("logs", {})
    for name, size in logs.items() if isinstance(logs, dict) else [("", logs)]:
        if not _count(size):
            raise bad(
                f"logs.{name}", size, "a non-negative integer: the log's length in bytes at the checkpoint"
            )
    pool = state.get("prompt_pool")
    if not isinstance(pool, dict):
        raise bad("prompt_pool", pool, "an object: the prompt pool's cursor and groups")
    rows, epoch, cursor, issued = (pool.get(k) for k in ("num_rows", "epoch", "cursor", "next_group_id"))
    if not _count(rows) or rows == 0:
        raise bad("prompt_pool.num_rows", rows, "a positive integer: the dataset's rows")
    if not _count(epoch):
        raise bad("prompt_pool.epoch", epoch, "a non-negative integer")
    if not _count(cursor) or cursor > rows:
        raise bad("prompt_pool.cursor", cursor, f"an integer from 0 to num_rows = {rows}")
    if not _count(issued) or issued != epoch * rows + cursor:
        raise bad(
            "prompt_pool.next_group_id",
            issued,
            f"epoch x num_rows + cursor = {epoch * rows + cursor} (the pool draws one row a group)",
        )

    def listed(where: Any, key: str, field: str) -> list[Any]:
        value = where.get(key) if isinstance(where, dict) else None
        if not isinstance(value, list):
            raise bad(field, value, "a list, as `laminar train` writes it")
        return value

    def group_id(g: Any) -> Any:
        return g.get("group_id") if isinstance(g, dict) else g

    named: list[
        tuple[str, Any]
    ] = []  # (field, group id or trajectory id) for everything the checkpoint names
    for key in ("outstanding", "returned"):
        field = f"prompt_pool.{key}"
        named += [(f"{field}[].group_id", group_id(g)) for g in listed(pool, key, field)]
    entries = listed(state.get("partial_pool"), "entries", "partial_pool.entries")
    named += [
        ("partial_pool.entries[].traj_id", e.get("traj_id") if isinstance(e, dict) else e) for e in entries
    ]
    named += [("buffer.seen[]", tid) for tid in listed(state.get("buffer"), "seen", "buffer.seen")]
    named += [("trained_ids[]", tid) for tid in listed(state, "trained_ids", "trained_ids")]
    last = -1
    for field, value in named:
        group = (value if _count(value) else None) if field.endswith("group_id") else _traj_group(value)
        if group is not None and group < 0:  # an evaluation's: never the prompt pool's
            continue
        if group is None or group >= issued:
            raise bad(field, value, f"a group issued: an id below prompt_pool.next_group_id = {issued}")
        last = max(last, group)
    if issued > last + 1:
        raise bad(
            "prompt_pool.next_group_id",
            issued,
            f"at most {last + 1}: the checkpoint names no group past {last} (every group the pool issued is "
            "outstanding or queued there, in flight, seen by the buffer or trained)",
        )


def checkpoint_version(path: Path) -> int:
    """The trainer's version a checkpoint holds (`check_checkpoint` has checked it)."""
    return read_json(path / "trainer_state.json", "trainer step, optimizer groups and RNG")["version"]


def replica_weights(lora_adapters: bool, path: Path) -> dict[str, Any]:
    """Where a resumed run's replicas take their first weights, as the `Factory`'s arguments: the checkpoint's
    model (LoRA: merged) at its version; with LoRA adapters published alone (`lora_adapters`), the base from
    `model.path` plus the checkpoint's adapters, since every version to come is added to that base."""
    version = checkpoint_version(path)
    if lora_adapters:
        return {"adapter_path": str(path / ADAPTER_DIR), "version": version}
    return {"engine_path": str(path), "version": version}


def restore_checkpoint(rt: Any, path: Path) -> None:
    """The trainer, the prompt pool and the buffer of `rt` back at the checkpoint's version."""
    t = rt.cfg.run.timeout_s
    rt.version = rt.trainer.call("load_checkpoint", str(path), timeout=t * 5)
    state = read_json(path / RUNTIME_STATE, "prompt pool, buffer and in-flight frontier")
    ray.get(rt.prompt_pool.load_state_dict.remote(state["prompt_pool"]), timeout=t)
    ray.get(rt.buffer.load_state_dict.remote(state["buffer"]), timeout=t)
    # In-flight work was generated by versions whose weights are gone: its groups are issued again; a group
    # the buffer holds samples of keeps them only if the new ones come from the same version (a group is
    # trained at one version, so a newer sample replaces its group's older ones).
    rt.restarted_on_resume = len(state["partial_pool"]["entries"])
    ray.get(rt.prompt_pool.reissue_outstanding.remote(), timeout=t)
    rt.trained_ids = set(state["trained_ids"])
    held = ray.get(rt.buffer.stats.remote(), timeout=t)["ready_groups"]
    ray.get(rt.manager.resume.remote(rt.version, held), timeout=t)
