"""The run's plots: throughput as rates over equal windows of wall time (no spikes from the reports' spacing),
and every figure drawn from records alone, as `laminar plot RUN_DIR` draws them again."""

import json

import numpy as np
import pytest

from laminar.telemetry.plots import main, plot_run, window_rates


def records(seconds: int = 80, replicas: int = 3) -> list[dict]:
    """A step of 1,000 tokens every 2 s; each replica generating 500 tokens/s, reporting at uneven spacing."""
    out = [
        {"kind": "step", "t": float(t), "tokens": 1000, "reward_mean": 0.5, "staleness": [0, 1]}
        for t in range(2, seconds + 1, 2)
    ]
    for rep in range(replicas):
        t = 0.3 * rep
        while t < seconds:
            t += 0.4 if int(t) % 3 else 1.7  # bursts and gaps, as heartbeats and batches make them
            out.append(
                {
                    "kind": "replica",
                    "replica": rep,
                    "t": t,
                    "tokens_generated": int(500 * t),
                    "kv_blocks_used": 10 * rep,
                    "kv_blocks_total": 64,
                    "version": int(t // 2),
                }
            )
    return out


def test_window_rates_are_the_true_rates_whatever_the_reports_spacing():
    rec = records()
    steps = [r for r in rec if r["kind"] == "step"]
    by_rep = {}
    for r in rec:
        if r["kind"] == "replica":
            by_rep.setdefault(r["replica"], []).append(r)
    edges, trained, generated = window_rates(steps, by_rep)
    width = edges[1] - edges[0]
    assert width == pytest.approx(2.0, rel=0.01) and len(trained) == len(generated) == len(edges) - 1
    inner = slice(2, -2)  # the first and last windows hold part of a report's interval
    assert np.allclose(trained[inner], 1000.0 / width)  # 1,000 tokens every 2 s, one step a window
    # three replicas at 500/s: a window holds whole reports (up to 1.7 s apart), so each is near, the mean close
    assert np.allclose(generated[inner], 1500.0, rtol=0.5) and generated[inner].mean() == pytest.approx(
        1500, rel=0.05
    )
    assert generated.sum() * width == pytest.approx(
        sum(max(r["tokens_generated"] for r in v) for v in by_rep.values())
    )
    assert trained.sum() * width == pytest.approx(1000 * len(steps))


def test_laminar_plot_draws_a_runs_figures_again_from_its_metrics(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records(replicas=20)) + '{"cut')
    assert main([str(run)]) == 0
    out = capsys.readouterr()
    assert "line 1" not in out.err and "is not JSON; skipped" in out.err  # the cut last line, named
    for name in ("reward.png", "throughput.png", "staleness.png", "replicas.png"):
        assert (run / name).stat().st_size > 10_000, name
    assert main([str(tmp_path / "nothing")]) == 2
    assert "metrics.jsonl does not exist" in capsys.readouterr().err
    assert [p.name for p in plot_run([], tmp_path)] == [
        "reward.png",
        "throughput.png",
        "staleness.png",
        "replicas.png",
    ]
