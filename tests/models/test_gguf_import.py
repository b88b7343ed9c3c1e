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


def test_a_gguf_is_parsed_once_and_dequantizing_says_its_progress(tmp_path):
    gguf = pytest.importorskip("gguf")
    import numpy as np

    from laminar.models.gguf_import import gguf_read_once

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    for i in range(4):
        writer.add_tensor(f"blk.{i}.w", np.full((2, 3), i, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    originals = (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize)
    said: list[str] = []
    with gguf_read_once(said.append, every_s=0.0):
        first, again = gguf.GGUFReader(path), gguf.GGUFReader(str(path))
        assert first is again  # the header parsed once
        values = [gguf.dequantize(t.data, t.tensor_type) for t in first.tensors]
    assert [float(v.max()) for v in values] == [0.0, 1.0, 2.0, 3.0]
    assert said[0].startswith("dequantized 1/4 tensors in ") and said[-1].startswith(
        "dequantized 3/4 tensors"
    )
    assert (gguf.GGUFReader, gguf.get_tensor_name_map, gguf.dequantize) == originals
    assert gguf.GGUFReader(path) is not gguf.GGUFReader(path)  # outside the block, gguf's own again
