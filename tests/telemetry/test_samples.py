"""A few trajectories of a step as text: which ones, the fields of a `samples.jsonl` row, and the same rows in
TensorBoard's text tab and a W&B table."""

from __future__ import annotations

import json
import struct
import sys
import types
from pathlib import Path

from laminar.data.codec import TaskCodec
from laminar.data.records import Trajectory
from laminar.tasks.reverse import demo_codec
from laminar.telemetry.recorder import Recorder
from laminar.telemetry.samples import due, markdown, pick, sample_rows
from laminar.telemetry.tracking import Trackers

SAMPLE_FIELDS = {
    "step",
    "traj_id",
    "version",
    "replica",
    "reward",
    "finish_reason",
    "prompt_text",
    "response_text",
}


def read_texts(logdir: Path) -> dict[str, list[tuple[int, str]]]:
    """Every text summary in the TensorBoard event files under `logdir`: tag -> [(step, text)]."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, str]]] = {}
    for path in sorted(Path(logdir).glob("events.out.tfevents.*")):
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for value in event.summary.value:
                if value.tensor.string_val:
                    out.setdefault(value.tag, []).append((event.step, value.tensor.string_val[0].decode()))
    return out


def groups_of(codec: TaskCodec, prompts: list[str], size: int, version: int = 3) -> list[list[Trajectory]]:
    groups = []
    for g, prompt in enumerate(prompts):
        ids = codec.encode_prompt(prompt)
        groups.append(
            [
                Trajectory(
                    traj_id=f"{g}:{i}",
                    group_id=g,
                    sample_idx=i,
                    prompt_ids=ids,
                    response_ids=codec.encode_answer(f"{i} {g}"),
                    logprobs=[0.0] * 4,
                    version=version,
                    reward=float(i % 2),
                    finish_reason="stop",
                    replica=g % 2,
                )
                for i in range(size)
            ]
        )
    return groups


def test_samples_are_spread_over_the_steps_groups_and_due_every_n_steps():
    codec = demo_codec()
    groups = groups_of(codec, ["1 2 =", "3 4 =", "5 6 ="], size=4)
    assert [t.traj_id for t in pick(groups, 4)] == ["0:0", "1:0", "2:0", "0:1"]
    assert len(pick(groups, 100)) == 12 and pick([], 4) == []
    assert [s for s in range(1, 31) if due(10, s)] == [10, 20, 30]
    assert not any(due(0, s) for s in range(1, 31))


def test_a_sample_row_holds_the_prompt_and_response_as_text_with_reward_version_and_replica():
    codec = demo_codec()
    groups = groups_of(codec, ["1 2 =", "3 4 ="], size=2)
    rows = sample_rows(groups, step=7, count=3, codec=codec)
    assert [r["traj_id"] for r in rows] == ["0:0", "1:0", "0:1"]
    for row in rows:
        assert set(row) == SAMPLE_FIELDS
        t = next(t for g in groups for t in g if t.traj_id == row["traj_id"])
        assert row["step"] == 7 and row["version"] == 3 and row["replica"] == t.replica
        assert row["reward"] == t.reward and row["finish_reason"] == "stop"
        assert row["response_text"] == codec.response_text(
            t.response_ids, t.loss_mask
        )  # as trajectories.jsonl
    # the prompt as the model read it, without the tokenizer's BOS; the response up to its end token
    assert [(r["prompt_text"], r["response_text"]) for r in rows] == [
        ("1 2 =", "0 0"),
        ("3 4 =", "0 1"),
        ("1 2 =", "1 0"),
    ]


def test_the_recorder_appends_samples_and_the_trackers_show_them_as_text(tmp_path, monkeypatch):
    logged = []
    fake_wandb = types.SimpleNamespace(
        Table=lambda columns, data: {"columns": columns, "data": data},
    )
    monkeypatch.setitem(sys.modules, "wandb", fake_wandb)
    trackers = Trackers(tmp_path, 0.0, {})
    trackers.wandb = types.SimpleNamespace(
        log=lambda values, step: logged.append((step, values)), finish=lambda: 0
    )
    rec = Recorder(tmp_path, t0=0.0, trackers=trackers)
    codec = demo_codec()
    groups = groups_of(codec, ["1 2 =", "3 4 ="], size=2)
    rec.samples(2, sample_rows(groups, 2, 2, codec))
    rec.samples(4, sample_rows(groups, 4, 2, codec))
    rec.close()
    rows = [json.loads(line) for line in (tmp_path / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["traj_id"]) for r in rows] == [(2, "0:0"), (2, "1:0"), (4, "0:0"), (4, "1:0")]
    texts = read_texts(tmp_path / "tensorboard")
    [(tag, shown)] = texts.items()
    assert tag.startswith("samples") and [step for step, _ in shown] == [2, 4]
    assert shown[0][1] == markdown(rows[:2]) and rows[0]["response_text"] in shown[0][1]
    assert [step for step, _ in logged] == [2, 4]
    table = logged[0][1]["samples"]
    assert table["columns"] == list(rows[0]) and table["data"][1] == list(rows[1].values())
