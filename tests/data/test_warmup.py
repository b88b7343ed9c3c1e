from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from laminar.data.codec import TaskCodec
from laminar.engine.model_dir import check_model_dir
from laminar.tasks.warmup import main, progress_due, progress_line


def test_warmup_writes_a_loadable_hf_dir_and_prints_its_progress_with_the_total(tmp_path, capsys):
    out = tmp_path / "w"
    assert main(["--out", str(out), "--steps", "2"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("warmup step")]
    assert [line.split(" loss")[0] for line in lines] == ["warmup step 1/2", "warmup step 2/2"]
    assert all(", ETA " in line for line in lines)
    check_model_dir(out)
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "generation_config.json",
        "warmup.json",
    ):
        assert (Path(out) / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(out)
    codec = TaskCodec.from_dir(out)
    n_params = sum(p.numel() for p in model.parameters())
    assert 200_000 <= n_params <= 2_000_000
    logits = model(torch.tensor([codec.encode_prompt("1 2 =")])).logits
    assert logits.shape[-1] == codec.vocab_size == model.config.vocab_size


def test_warmup_device_is_checked(tmp_path, capsys):
    import pytest

    with pytest.raises(SystemExit):
        main(["--out", str(tmp_path / "w"), "--steps", "1", "--device", "tpu"])
    assert "give cpu or cuda" in capsys.readouterr().err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit):
            main(["--out", str(tmp_path / "w"), "--steps", "1", "--device", "cuda"])
        assert "no CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "w").exists()


def test_the_progress_line_gives_the_total_and_the_time_left():
    assert progress_line(50, 200, 1.23456, 10.0) == "warmup step 50/200 loss 1.235, 10.0 s, ETA 30 s"
    assert progress_line(200, 200, 0.5, 40.04).endswith("40.0 s, ETA 0 s")


def test_progress_prints_every_50_steps_or_10_seconds_whichever_comes_first():
    assert progress_due(1, 300, 0.0) and progress_due(300, 300, 0.0)  # the first step and the last
    assert progress_due(50, 300, 1.0) and not progress_due(51, 300, 1.0)
    assert progress_due(7, 300, 10.0) and not progress_due(7, 300, 9.9)  # slow steps: by the clock
