"""A pipelined engine (each decode step queued before the last one's tokens reach the host) gives every request
what the step-by-step engine gives it: the same tokens, log-probs, versions, mask and end, through stops, length
limits, parks and resumes, aborts, moves, new arrivals, preemption and weight loads. (The order of steps may
differ: a step already queued when a request arrives runs before that request's prefill.) On CPU every step
runs at once, so these check the bookkeeping: which rows of a queued step count, and which are dropped."""

import pytest

from laminar.engine import SamplingParams

from .helpers import engine_for, hf_model

PROMPTS = [[5 + i, 17, 30 + 3 * i, 9, 44, 2 + i] for i in range(10)]


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


def params(i: int) -> SamplingParams:
    """Varied ends: length limits from 6 to 38 tokens, a few stop and park tokens, EOS on for some."""
    return SamplingParams(
        temperature=1.0,
        max_new_tokens=6 + 4 * i,
        stop_token_ids=(40, 41, 42) if i % 3 == 0 else (),
        park_token_ids=(50, 51, 52, 53) if i % 4 == 1 else (),
        ignore_eos=i % 2 == 0,
        seed=100 + i,
    )


def scripted_run(model, pipeline: bool, **engine_kw) -> tuple[list, dict, int]:
    """The same requests and the same calls between steps, whatever the engine: the per-step outputs, the
    finished requests, and how many steps found a next step already queued."""
    e = engine_for(model, pipeline=pipeline, **engine_kw)
    for i in range(8):
        e.add_request(f"r{i}", PROMPTS[i], params(i))
    steps, queued, log, done, resume_at = 0, 0, [], {}, {}
    while e.has_unfinished():
        out = e.step()
        steps += 1
        queued += e._inflight is not None
        log.append((sorted(out.new_tokens.items()), sorted(f.request_id for f in out.finished), out.parked))
        done.update({f.request_id: f for f in out.finished})
        for rid in out.parked:
            resume_at[rid] = steps + 3
        for rid, at in list(resume_at.items()):
            if steps >= at:
                fin = e.resume(rid, [60, 61])
                if fin is not None:
                    done[rid] = fin
                del resume_at[rid]
        live = set(e._seqs)
        if steps == 4 and "r7" in live:
            e.abort("r7")
        if steps == 6 and "r6" in live and "r6" not in resume_at:
            e.park("r6")  # a tool call found by the caller, not by a park token
            resume_at["r6"] = steps + 2
        if steps == 8 and "r5" in live and "r5" not in resume_at:
            e.import_request(e.export_request("r5", with_kv=True))
        if steps == 9 and "r4" in live and "r4" not in resume_at:
            e.import_request(e.export_request("r4"))
        if steps == 10:
            e.add_request("r8", PROMPTS[8], params(8))
            e.add_request("r9", PROMPTS[0], params(9))  # shares r0's prompt
    stats = e.stats()
    assert stats.queued_ahead == queued and stats.decode_steps >= queued
    if pipeline:
        assert stats.dropped_rows > 0  # stops, parks, moves and the abort each leave a queued row behind
    return log, done, queued


def finished_as_tuples(done: dict) -> dict:
    return {
        rid: (f.output_token_ids, f.token_versions, f.finish_reason, f.loss_mask) for rid, f in done.items()
    }


def assert_same_log_probs(done: dict, other: dict) -> None:
    """Equal up to float rounding: a queued step may carry rows that are dropped later, and a batch of another
    size sums in another order (about 1e-6 here)."""
    for rid, f in done.items():
        assert f.logprobs == pytest.approx(other[rid].logprobs, abs=1e-5), rid


@pytest.mark.parametrize("blocks", [None, 14], ids=["room", "preempting"])
def test_pipelined_steps_equal_the_step_by_step_engine(model, blocks):
    kw = dict(max_num_seqs=8, num_kv_blocks=blocks, block_size=4)
    log, done, queued_off = scripted_run(model, False, **kw)
    log_p, done_p, queued = scripted_run(model, True, **kw)
    assert queued_off == 0
    assert queued > len(log) // 3, "the pipelined engine should queue the next decode step most of the time"
    assert log_p[:8] == log[:8]  # the same steps until the first arrival (a move, at step 8)
    assert finished_as_tuples(done_p) == finished_as_tuples(done)
    assert_same_log_probs(done_p, done)
    assert set(done) == {f"r{i}" for i in range(10)} - {"r7"}
    assert any(f.finish_reason == "stop" for f in done.values())
    assert any(0 in f.loss_mask for f in done.values()), "some request should have parked and resumed"


def test_a_weight_load_waits_for_the_queued_step_which_keeps_its_version(model):
    """A load after k steps of the pipelined engine equals a load after k + 1 steps of the step-by-step one:
    the step already queued finishes under the weights and version it was queued with."""
    other = hf_model("qwen2", seed=1).state_dict()
    runs = {}
    for pipeline, load_after in ((False, 7), (True, 6)):
        e = engine_for(model, pipeline=pipeline, max_num_seqs=8)
        for i in range(4):
            e.add_request(f"r{i}", PROMPTS[i], SamplingParams(max_new_tokens=20, ignore_eos=True, seed=i))
        done, steps = {}, 0
        while e.has_unfinished():
            done.update({f.request_id: f for f in e.step().finished})
            steps += 1
            if steps == load_after:
                assert (e._inflight is not None) == pipeline
                e.load_state_dict(other, version=1)
        runs[pipeline] = done
    assert_same_log_probs(runs[True], runs[False])
    runs = {k: finished_as_tuples(v) for k, v in runs.items()}
    assert runs[True] == runs[False]
    versions = runs[True]["r0"][1]
    assert 0 < versions.index(1) < len(versions), "tokens before and after the load"
