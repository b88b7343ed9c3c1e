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
