"""Resuming rewinds the run's logs to the checkpoint: what was logged after it moves aside, nothing is lost."""

import json

from laminar.jsonio import write_json
from laminar.runtime.checkpoint import RUNTIME_STATE, finish_checkpoint_swap, log_sizes, rewind_to_checkpoint


def lines(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_logs_past_the_checkpoint_move_aside(tmp_path):
    metrics, trajs = tmp_path / "metrics.jsonl", tmp_path / "trajectories.jsonl"
    metrics.write_text("".join(json.dumps({"kind": "step", "version": v}) + "\n" for v in (1, 2)))
    trajs.write_text(json.dumps({"traj_id": "0:0"}) + "\n")
    ckpt = tmp_path / "checkpoint"
    ckpt.mkdir()
    write_json(ckpt / RUNTIME_STATE, {"logs": log_sizes(tmp_path)})
    with open(metrics, "a") as f:  # the run went on past its checkpoint, then was killed
        f.write(json.dumps({"kind": "step", "version": 3}) + "\n")
    with open(trajs, "a") as f:
        f.write(json.dumps({"traj_id": "5:0"}) + "\n")
    moved = rewind_to_checkpoint(tmp_path, ckpt)
    assert [r["version"] for r in lines(metrics)] == [1, 2]
    assert [r["traj_id"] for r in lines(trajs)] == ["0:0"]
    assert [r["version"] for r in lines(tmp_path / "metrics.jsonl.rolled-back")] == [3]
    assert [r["traj_id"] for r in lines(tmp_path / "trajectories.jsonl.rolled-back")] == ["5:0"]
    assert moved == {"metrics.jsonl": len(json.dumps({"kind": "step", "version": 3})) + 1,
                     "trajectories.jsonl": len(json.dumps({"traj_id": "5:0"})) + 1}  # fmt: skip
    assert (
        rewind_to_checkpoint(tmp_path, ckpt) == {}
    )  # a second resume from the same checkpoint: nothing more


def test_a_kill_after_the_swap_leaves_the_new_checkpoint_and_drops_the_old(tmp_path):
    for name in ("checkpoint", "checkpoint.old"):
        (tmp_path / name).mkdir()
        (tmp_path / name / RUNTIME_STATE).write_text(f'{{"which": "{name}"}}')
    finish_checkpoint_swap(tmp_path / "checkpoint")
    assert not (tmp_path / "checkpoint.old").exists()
    assert (tmp_path / "checkpoint" / RUNTIME_STATE).read_text() == '{"which": "checkpoint"}'


def test_a_swap_cut_short_by_a_kill_is_finished(tmp_path):
    old = tmp_path / "checkpoint.old"
    old.mkdir()
    (old / RUNTIME_STATE).write_text("{}")
    finish_checkpoint_swap(tmp_path / "checkpoint")
    assert (tmp_path / "checkpoint" / RUNTIME_STATE).is_file() and not old.exists()
