import json

import pytest

from laminar.cli import main
from laminar.configure import load_config


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


def test_version_names_the_package_and_its_source_digest(capsys):
    from laminar.telemetry.provenance import code_digest

    assert main(["--version"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("laminar ") and out.endswith(f"(code {code_digest()})")


def test_config_prints_the_resolved_yaml_and_the_reward_it_scores_with(tmp_path, capsys):
    import yaml

    from laminar.configure import load_config

    path = tmp_path / "c.yaml"
    path.write_text("trainer:\n  steps: 7\n")
    assert main(["config", str(path), "trainer.lr=1e-5", "task.name=arith"]) == 0
    out = capsys.readouterr().out
    printed = yaml.safe_load(out)
    want = load_config(path, ["trainer.lr=1e-5", "task.name=arith"]).to_dict()
    assert printed == want and printed["trainer"]["steps"] == 7 and printed["buffer"]["capacity_groups"] == 48
    assert out.rstrip().splitlines()[-1] == (
        "# reward in use: laminar.rewards.math:default_score: the built-in arith task's own, as task.reward is empty"
    )
    assert main(["config", "rollout.replicas=2"]) == 0  # overrides alone: the demo's defaults
    assert yaml.safe_load(capsys.readouterr().out)["rollout"]["replicas"] == 2
    assert main(["config", "show", str(path), "rollout.replicas=2"]) == 0  # `show` reads as it says
    shown = yaml.safe_load(capsys.readouterr().out)
    assert shown["trainer"]["steps"] == 7 and shown["rollout"]["replicas"] == 2
    assert main(["config", "rollout.replicas=0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rollout.replicas=0 is invalid" in err[0]


def _refused_fast(argv, capsys, monkeypatch):
    """`laminar train argv`: (exit code, stderr lines, seconds); the run itself must never start."""
    import time

    monkeypatch.setattr("laminar.train.train", lambda *a, **k: pytest.fail("the run started"))
    t0 = time.monotonic()
    code = main(["train", *argv])
    return code, capsys.readouterr().err.strip().splitlines(), time.monotonic() - t0


def test_cuda_asked_for_on_a_machine_without_it_is_one_line_before_ray(tmp_path, capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # this machine, or any without CUDA
    code, err, seconds = _refused_fast(
        ["model.device=cuda", f"run.out={tmp_path / 'run'}"], capsys, monkeypatch
    )
    assert code == 2 and len(err) == 1 and seconds < 5, err
    assert err[0].startswith(
        "laminar train: bad configuration: model.device='cuda' but this machine has no usable"
    )
    assert err[0].endswith("use model.device=cpu or auto")


def test_a_run_that_cannot_fit_is_refused_in_one_line_before_ray_unless_told_to_start(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    """A KV cache far beyond this machine's memory: refused in seconds, naming the knob; with
    run.check_memory=false the same estimate is only a warning (the pre-flight lets it through)."""
    from laminar.runtime import memory

    monkeypatch.setattr(memory, "host_available", lambda: 8 << 30)  # what any machine may have left
    big = [f"model.path={tiny_model_dir}", "rollout.kv_blocks=4000000", f"run.out={tmp_path / 'run'}"]
    code, err, seconds = _refused_fast(big, capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and seconds < 5, err
    assert err[0].startswith("laminar train: bad configuration: the run needs about ")
    assert "8.00 GiB is available: lower rollout.kv_blocks" in err[0]
    assert err[0].endswith("(or run.check_memory=false to start it anyway)")
    cfg = load_config(None, [*big, "run.check_memory=false"])
    line, warning = memory.check_memory(cfg, tiny_model_dir, cuda=False)
    assert line.startswith("memory estimate") and warning.startswith("warning: the run needs about ")


def test_a_model_directory_without_a_tokenizer_or_of_another_architecture_is_one_line(
    tiny_model_dir, tmp_path, capsys, monkeypatch
):
    import json
    import shutil

    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(tiny_model_dir / name, bare / name)
    code, err, seconds = _refused_fast([f"model.path={bare}", "task.name=arith"], capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and seconds < 5, err
    assert f"model directory {bare}: its tokenizer does not load" in err[0]

    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    config = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(
        json.dumps({**config, "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"})
    )
    code, err, seconds = _refused_fast([f"model.path={other}"], capsys, monkeypatch)
    assert code == 2 and len(err) == 1 and seconds < 5, err
    assert "unknown architecture ['GPT2LMHeadModel']: the engine implements" in err[0]


def test_own_rows_are_scored_by_the_math_reward_and_the_run_says_so_at_the_start(tmp_path):
    """The case that was silent: data.train_files without task.reward was scored by the demo's digit reversal."""
    from laminar.configure import load_config
    from laminar.preflight import check_inputs, start_lines
    from tests.realmodel import write_real_model_dir

    model = write_real_model_dir(tmp_path / "model", "chatml")
    rows = tmp_path / "train.jsonl"
    rows.write_text(
        "".join(
            json.dumps({"prompt": f"What is {a} + 30?", "ground_truth": str(a + 30)}) + "\n" for a in range(4)
        )
    )
    cfg = load_config(None, [f"model.path={model}", f"data.train_files={rows}", "trainer.lr=1e-5"])
    check_inputs(cfg)  # the dry run of the math reward passes on these rows
    lines = start_lines(cfg, str(model))
    assert lines[0].startswith(
        "reward laminar.rewards.math:default_score: the rows are your own (data.train_files) and task.reward is empty"
    )
    assert lines[1].startswith("memory estimate (host): per replica ") and len(lines) == 2
