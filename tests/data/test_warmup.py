from pathlib import Path

import torch
from transformers import AutoModelForCausalLM

from laminar.data.tasks import TaskCodec
from laminar.data.warmup import main
from laminar.trainer.trainer import check_model_dir


def test_warmup_writes_a_loadable_hf_dir(tmp_path):
    out = tmp_path / "w"
    assert main(["--out", str(out), "--steps", "2"]) == 0
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
