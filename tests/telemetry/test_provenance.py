"""The source digest that results carry: any change to a source file's path or contents changes it."""

from laminar.telemetry.provenance import code_digest


def test_the_digest_follows_every_source_file_and_only_those(tmp_path):
    def digest_of(files: dict[str, str]) -> str:
        root = tmp_path / f"pkg{len(list(tmp_path.iterdir()))}"
        for name, text in files.items():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            (root / name).write_text(text)
        return code_digest(root)

    base = {"a.py": "x = 1\n", "sub/b.py": "y = 2\n"}
    first = digest_of(base)
    assert len(first) == 12 and digest_of(base) == first  # the same files, another folder
    assert digest_of({**base, "a.py": "x = 2\n"}) != first  # one byte
    assert digest_of({"a.py": "x = 1\n", "sub/c.py": "y = 2\n"}) != first  # a rename
    assert digest_of({**base, "notes.txt": "not code"}) == first  # only source counts
    assert len(code_digest()) == 12  # the installed package's
