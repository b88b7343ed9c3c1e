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
