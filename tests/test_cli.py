import json

import pytest

from laminar.cli import main


def test_bad_train_inputs_stop_before_anything_starts_and_say_what_is_wrong(tmp_path, capsys):
    assert main(["train", f"model.path={tmp_path}"]) == 2
    assert "has no config.json" in capsys.readouterr().err
    assert main(["train", "rollout.replicas=0"]) == 2
    assert "rollout.replicas=0 is invalid" in capsys.readouterr().err
    assert main(["train", "--resume", str(tmp_path)]) == 2
    assert "config" in capsys.readouterr().err


def test_unknown_command_prints_usage(capsys):
    assert main(["frobnicate"]) == 2
    assert "laminar COMMAND" in capsys.readouterr().err


def test_bad_simulate_inputs_name_what_is_wrong(tmp_path):
    import pytest

    for args, message in [
        (["--model", "7x"], "model='7x'; valid: 0.5B, 7B, 32B, 72B"),
        (["--schedule", "laminar,nope"], "schedule='nope'; valid: sync"),
        (["--gpus", "1", "--model", "72b"], "gpus=1 is too few for model 72B"),
    ]:
        with pytest.raises(SystemExit, match=message.replace("(", r"\(")):
            main(["simulate", *args, "--out", str(tmp_path)])


def test_bench_batches_compare_plots_earlier_results_and_names_a_bad_file(tmp_path, capsys):
    row = {
        "batch": 1,
        "warm_up": False,
        "prefill_s": 0.03,
        "decode_s": 0.1,
        "other_s": 0.01,
        "schedule_s": 0.0,
    }
    good = tmp_path / "fused.json"
    good.write_text(json.dumps({"batches": [row], "decode_graph_replay_ms": {"1": 1.1, "256": 1.45}}))
    bad = tmp_path / "other.json"
    bad.write_text(json.dumps({"runs": []}))
    assert main(["bench", "batches", "--compare", str(good), "--out", str(tmp_path / "plots")]) == 0
    assert (tmp_path / "plots" / "batches.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        main(["bench", "batches", "--compare", str(good), str(bad), "--out", str(tmp_path)])
    assert "other.json: has no 'batches'" in capsys.readouterr().err


def test_a_config_file_that_is_not_yaml_and_a_run_folder_that_does_not_exist_are_one_line(tmp_path, capsys):
    bad = tmp_path / "run.yaml"
    bad.write_text("trainer:\n  steps: [4\n")
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"laminar train: bad configuration: config file '{bad}' is not YAML"
    )
    assert main(["train", "--resume", str(tmp_path / "gone")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"laminar train: cannot resume: the run folder {tmp_path / 'gone'} does not exist; --resume takes a folder "
        "that `laminar train` wrote (config.yaml, metrics.jsonl, checkpoint/)"
    ]


@pytest.mark.parametrize(
    "reward, says",
    [
        ("needs_a_missing_module", "raised: ModuleNotFoundError: No module named 'laminar_no_such_module'"),
        ("nan_always", "not_finite: returned nan"),
    ],
)
def test_a_reward_that_fails_on_every_row_stops_the_run_before_anything_starts(
    tiny_model_dir, tmp_path, capsys, monkeypatch, reward, says
):
    import time

    def started(*args, **kwargs):
        raise AssertionError("the run started")

    monkeypatch.setattr("laminar.train.train", started)
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"prompt": f"{d} 2 =", "answer": f"2 {d}"}) + "\n" for d in range(6)))
    t0 = time.monotonic()
    code = main(
        [
            "train",
            f"model.path={tiny_model_dir}",
            f"task.name={data}",
            f"task.reward=tests.runtime.faulty_rewards:{reward}",
        ]
    )
    elapsed = time.monotonic() - t0
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith(
        f"laminar train: bad configuration: reward function tests.runtime.faulty_rewards:{reward} failed on all 4 "
        "dataset rows tried before the start"
    )
    assert f"row 0: {says}" in err[0]
    assert elapsed < 60, f"{elapsed:.1f}s"


def test_a_run_whose_trajectory_audit_fails_exits_non_zero_with_one_line(tmp_path, capsys, monkeypatch):
    from laminar.telemetry.audit import audit_run
    from laminar.telemetry.summary import summarize

    out = tmp_path / "run"

    def lost_work(cfg, run, resume=False):  # the run ended with two ids issued and nowhere
        records = [
            {"kind": "segment", "t": 0.0, "resumed_at": None, "group_size": 2, "issued_groups": 0},
            {"kind": "step", "t": 1.0, "step": 1, "tokens": 8, "reward_mean": 0.5, "staleness": [0, 0],
             "traj_versions": {"0:0": [0], "0:1": [0]}},
            {"kind": "dispatch", "t": 1.0, "replica": 0, "version": 0, "groups": [1]},
            {"kind": "end", "t": 2.0, "issued_groups": 2, "in_flight": [], "held": [], "queued_groups": [],
             "dropped": {}},
        ]  # fmt: skip
        run.mkdir(parents=True)
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        audit = audit_run(run)
        return summarize(
            records, schedule="laminar", wall_s=2.0, warmup_steps=0,
            trajectories={**audit.counts(), "audit_ok": audit.ok},
        )  # fmt: skip

    monkeypatch.setattr("laminar.train.train", lost_work)
    assert main(["train", f"--out={out}"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "laminar train: the trajectory audit failed: 2 ids lost without a reason (issued, never trained and "
        f"nowhere at the end, e.g. 1:0, 1:1) (laminar audit {out})"
    ]
