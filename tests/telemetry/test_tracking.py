"""TensorBoard and W&B get the run log's numbers: every numeric field of every record as `kind/field`, at the
trainer step it belongs to; a W&B project without the package is one clear line before anything starts."""

from __future__ import annotations

import struct
import sys
from pathlib import Path

import pytest

from laminar.telemetry.recorder import Recorder
from laminar.telemetry.tracking import Trackers, check_wandb, scalars


def read_scalars(logdir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under `logdir`: tag -> [(step, value)] in write order. The
    files are TFRecords (length, its CRC, an `Event` protobuf, its CRC); tensorboardX ships the protobuf."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[tuple[int, float]]] = {}
    files = sorted(Path(logdir).glob("events.out.tfevents.*"))
    assert files, f"no event files in {logdir}"
    for path in files:
        data, pos = path.read_bytes(), 0
        while pos < len(data):
            (n,) = struct.unpack("<Q", data[pos : pos + 8])
            event = Event.FromString(data[pos + 12 : pos + 12 + n])
            pos += 12 + n + 4
            for value in event.summary.value:
                out.setdefault(value.tag, []).append((event.step, value.simple_value))
    return out


def test_scalars_are_the_numeric_fields_under_kind_slash_field():
    record = {"kind": "eval", "t": 3.5, "step": 4, "accuracy": 0.25, "n": 64, "ok": True, "split": "val"}
    record |= {"lengths": [1, 2], "error": None}
    assert scalars(record) == {"eval/step": 4.0, "eval/accuracy": 0.25, "eval/n": 64.0, "eval/ok": 1.0}
    assert scalars({"kind": "phase", "t": 0.1, "what": "starting Ray"}) == {}


def test_event_files_hold_what_the_recorder_logged(tmp_path):
    rec = Recorder(tmp_path, t0=1000.0, trackers=Trackers(tmp_path, 1000.0, {"trainer": {"lr": 1e-5}}))
    rec.log("step", t=1001.0, step=1, reward_mean=0.5, loss=-0.25, staleness=[0, 1])
    rec.log("replica", t=1001.5, replica=0, tokens_generated=120)  # between steps: at the last step
    rec.log("step", t=1002.0, step=2, reward_mean=0.75, loss=float("nan"))  # NaN is logged as null: left out
    rec.log("eval", t=1002.5, step=2, accuracy=0.125)
    rec.close()
    got = read_scalars(tmp_path / "tensorboard")
    assert got["step/reward_mean"] == [(1, 0.5), (2, 0.75)]
    assert got["step/loss"] == [(1, -0.25)]
    assert got["replica/tokens_generated"] == [(1, 120.0)]
    assert got["eval/accuracy"] == [(2, 0.125)]
    assert "step/staleness" not in got


def test_a_wandb_project_without_the_package_is_one_line_before_anything_starts(monkeypatch, capsys):
    from laminar.train import main

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if it were not installed
    with pytest.raises(ValueError, match=r"pip install 'laminar\[wandb\]'"):
        check_wandb("my-project")
    check_wandb("")  # no project: no package needed
    assert main(["run.wandb_project=my-project", "trainer.steps=1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "run.wandb_project" in err[0] and "laminar[wandb]" in err[0], err


def test_wandb_writes_an_offline_run_in_the_run_folder(tmp_path, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    rec = Recorder(
        tmp_path, trackers=Trackers(tmp_path, 0.0, {"trainer": {"lr": 1e-5}}, wandb_project="laminar-test")
    )
    rec.log("step", step=1, reward_mean=0.5)
    rec.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert len(runs) == 1 and list(runs[0].glob("*.wandb")), sorted(
        p.name for p in (tmp_path / "wandb").iterdir()
    )
