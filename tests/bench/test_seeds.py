"""`laminar bench seeds`: the ratios over seeds come from the benchmark folders, and bad arguments are named."""

from __future__ import annotations

import json

import pytest

from laminar.bench.seeds import main


def bench_dir(path, **tokens_per_s):
    path.mkdir(parents=True)
    results = [
        {"label": label, "train_tokens_per_s": value, "staleness": {"p99": 2 if label == "sync" else 3}}
        for label, value in tokens_per_s.items()
    ]
    (path / "schedules.json").write_text(json.dumps({"meta": {}, "results": results}))
    return path


def test_ratios_per_seed_and_over_seeds(tmp_path, capsys):
    a = bench_dir(tmp_path / "a", sync=1000.0, laminar=2500.0)
    b1 = bench_dir(tmp_path / "b1", laminar=3000.0)  # one seed's schedules from two device calls
    b2 = bench_dir(tmp_path / "b2", sync=2000.0)
    assert main([f"s0={a}", f"s1={b1},{b2}", "--out", str(tmp_path / "out")]) == 0
    rows = {r["label"]: r for r in json.loads((tmp_path / "out" / "seeds.json").read_text())["schedules"]}
    lam = rows["laminar"]
    assert lam["ratio_by_seed"] == {"s0": 2.5, "s1": 1.5}
    assert lam["ratio_of_means"] == pytest.approx(2750 / 1500) and lam["mean_of_ratios"] == pytest.approx(2.0)
    assert (lam["ratio_min"], lam["ratio_max"], lam["staleness_p99_max"]) == (1.5, 2.5, 3)
    assert "| laminar | 2,500 | 3,000 | 2,750 | 2.50x, 1.50x | 1.83x | 2.00x | 3 |" in capsys.readouterr().out


def test_bad_arguments_are_named(tmp_path, capsys):
    a = bench_dir(tmp_path / "a", sync=1.0, laminar=2.0)
    for args, says in (
        ([str(a)], "give NAME=DIR"),
        ([f"s0={tmp_path / 'none'}"], "no schedules.json"),
        ([f"s0={a},{a}"], "in two folders of one seed"),
        ([f"s0={a}", f"s0={a}"], "seed names repeat"),
        ([f"s0={a}", "--reference", "stream"], "'stream' is in no seed"),
    ):
        with pytest.raises(SystemExit):
            main([*args, "--out", str(tmp_path / "out")])
        assert says in capsys.readouterr().err
