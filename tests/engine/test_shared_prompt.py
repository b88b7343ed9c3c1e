"""One prefill per group: the samples of a group share their prompt's full KV blocks (reference counted), so the
prompt is computed once, and every sample still produces exactly what it would have alone."""

import pickle

import pytest

from laminar.engine import SamplingParams

from .helpers import drain, engine_for, hf_model

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True, seed=3)
PROMPT = [(7 * i) % 200 + 20 for i in range(40)]  # 40 tokens: two full blocks of 16 and a partial one
G = 4


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


@pytest.fixture(scope="module")
def alone(model):
    """Each sample in an engine of its own: nothing to share."""
    out = {}
    for i in range(G):
        e = engine_for(model, block_size=16)
        e.add_request(f"s{i}", PROMPT, PARAMS)
        out.update(drain(e))
    return out


def check_same(got, alone):
    for rid, f in got.items():
        assert f.output_token_ids == alone[rid].output_token_ids, rid
        assert f.logprobs == pytest.approx(alone[rid].logprobs, abs=1e-4), rid


def test_a_group_prefills_its_prompt_once_and_samples_as_if_alone(model, alone):
    e = engine_for(model, block_size=16)
    for i in range(G):
        e.add_request(f"s{i}", PROMPT, PARAMS)
    first = e.step()  # one prefill: the others read the prompt their first computes in the same forward
    assert first.is_prefill and len(first.new_tokens) == G
    got = {**{f.request_id: f for f in first.finished}, **drain(e)}
    check_same(got, alone)
    stats = e.stats()
    shared = 2 * 16  # the full blocks of the prompt, less the block that holds its last token
    assert stats.shared_prompt_tokens == (G - 1) * shared
    assert stats.prefill_tokens == len(PROMPT) + (G - 1) * (len(PROMPT) - shared)
    assert stats.kv_blocks_used == 0 and not any(e.blocks.refs)  # every reference returned


def test_shared_blocks_survive_the_first_sample_leaving_and_preemption(model, alone):
    e = engine_for(model, block_size=16, num_kv_blocks=7)  # tight: decode preempts
    for i in range(G):
        e.add_request(f"s{i}", PROMPT, PARAMS)
    e.step()  # the first sample computes the prompt, the others start from its blocks
    e.step()
    e.abort("s0")  # the first leaves; the blocks it shared stay with the others
    got = drain(e)
    check_same(got, alone)
    assert e.stats().num_preemptions > 0
    assert e.stats().kv_blocks_used == 0 and not any(e.blocks.refs)


def test_a_sample_that_shares_moves_with_a_copy_of_what_it_needs(model, alone):
    src, dst = engine_for(model, block_size=16), engine_for(model, block_size=16)
    for i in range(G):
        src.add_request(f"s{i}", PROMPT, PARAMS)
    for _ in range(6):
        src.step()
    moved = pickle.loads(pickle.dumps(src.export_request("s2")))  # it held blocks of s0's
    dst.import_request(moved)
    got = {**drain(src), **drain(dst)}
    check_same(got, alone)
    for e in (src, dst):
        assert e.stats().kv_blocks_used == 0 and not any(e.blocks.refs)


def test_other_prompts_and_short_prompts_share_nothing(model):
    e = engine_for(model, block_size=16)
    e.add_request("a", PROMPT, PARAMS)
    e.add_request("b", PROMPT[:-1] + [3], PARAMS)  # differs in the last token only: its full blocks match...
    e.add_request("c", [5, 6, 7], PARAMS)
    e.add_request("d", [5, 6, 7], PARAMS)  # ...but requests share only with an identical prompt
    drain(e)
    assert e.stats().shared_prompt_tokens == 0
