"""`laminar model import` refuses what it cannot import with one line saying what would be right."""

import pytest

from laminar.cli import main


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("model.safetensors", b"\x00" * 16, "takes a .gguf file (llama.cpp's format), got '.safetensors'"),
        ("absent.gguf", None, "absent.gguf does not exist; give the path of a .gguf file"),
        ("fake.gguf", b"PK\x03\x04 a zip", "is not a GGUF file: it starts with b'PK\\x03\\x04'"),
    ],
)
def test_import_refuses_what_is_not_a_gguf_file(tmp_path, capsys, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    assert main(["model", "import", str(path), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_import_will_not_overwrite_a_model_directory(tmp_path, capsys):
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF" + b"\x00" * 12)
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "config.json").write_text("{}")
    assert main(["model", "import", str(gguf), "--out", str(tmp_path / "out")]) == 2
    assert "already holds a model" in capsys.readouterr().err
