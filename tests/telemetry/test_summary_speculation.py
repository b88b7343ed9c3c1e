"""summary.json's `speculation`: the replicas' last snapshots summed (their counters only ever grow)."""

from laminar.telemetry.summary import summarize


def replica(rid: int, t: float, **counters) -> dict:
    base = {
        "kind": "replica",
        "replica": rid,
        "t": t,
        "tokens_generated": 0,
        "kv_blocks_used": 0,
        "kv_blocks_total": 1,
    }
    return {**base, **counters}


def test_speculation_counters_reach_the_summary():
    records = [
        replica(0, 1.0, decode_steps=5, verify_steps=2, draft_rows=2, draft_tokens=8, accepted_tokens=2),
        replica(
            0,
            2.0,
            decode_steps=10,
            verify_steps=4,
            draft_rows=5,
            draft_tokens=20,
            accepted_tokens=12,
            verify_tokens=16,
            draft_s=0.25,
        ),
        replica(
            1,
            2.0,
            decode_steps=10,
            verify_steps=6,
            draft_rows=5,
            draft_tokens=20,
            accepted_tokens=8,
            verify_tokens=12,
            draft_s=0.5,
        ),
    ]
    s = summarize(records, schedule="laminar", wall_s=3.0, warmup_steps=0, trajectories={})
    spec = s["speculation"]
    assert spec["draft_tokens"] == 40 and spec["accepted_tokens"] == 20 and spec["acceptance"] == 0.5
    assert spec["tokens_per_verify"] == 2.8 and spec["verify_share"] == 0.5 and spec["draft_s"] == 0.75
    assert "gate_steps" not in spec  # no replica had a gate
    mine = spec["by_replica"]  # each replica's own, from its last snapshot
    assert mine["0"]["draft_tokens"] == 20 and mine["0"]["acceptance"] == 0.6 and mine["0"]["draft_s"] == 0.25
    assert mine["1"]["acceptance"] == 0.4 and mine["1"]["tokens_per_verify"] == 2.4
    assert mine["1"]["verify_share"] == 0.6
    gated = [
        replica(
            r,
            1.0,
            decode_steps=10,
            draft_tokens=4,
            gate_steps={"verify": 3, "plain": 5},
            gate_ms_per_token={"1": {"plain": 1.0 + r, "verify": None}},
        )
        for r in (0, 1)
    ]
    spec = summarize(gated, schedule="laminar", wall_s=3.0, warmup_steps=0, trajectories={})["speculation"]
    assert spec["gate_steps"] == {"verify": 6, "plain": 10}
    assert spec["gate_ms_per_token"] == {"1": {"plain": 1.5}}
    plain = summarize(
        [replica(0, 1.0, decode_steps=5)], schedule="laminar", wall_s=3.0, warmup_steps=0, trajectories={}
    )
    assert "speculation" not in plain
