"""Tool turns inside the engine: a request parks when its turn ends in a tool call, the tool's output is appended
as context, and it resumes from its cached prefix, sampling exactly what an uninterrupted request would."""

import pickle
from dataclasses import replace

import pytest

from laminar.engine import SamplingParams

from .helpers import drain, engine_for, hf_model

PARAMS = SamplingParams(temperature=1.0, max_new_tokens=30, ignore_eos=True, seed=7)
PROMPT = list(range(30, 50))
TOOL = [40, 41, 42, 43, 44]  # a tool's output, as the chat template would render it


@pytest.fixture(scope="module")
def model():
    return hf_model("qwen2")


def first_turn(engine, steps: int = 8) -> list[int]:
    """Run `steps` steps (a prefill, then decodes) of request r beside another request; park r."""
    engine.add_request("r", PROMPT, PARAMS)
    engine.add_request("other", [7, 8, 9], PARAMS)
    for _ in range(steps):
        engine.step()
    engine.park("r")
    return engine.progress("r")[0]


def uninterrupted(model, turn1: list[int]):
    """Request r with the first turn and the tool's output as its prompt: what the second turn must be."""
    fresh = engine_for(model)
    left = PARAMS.max_new_tokens - len(turn1) - len(TOOL)
    fresh.add_request("r", PROMPT + turn1 + TOOL, replace(PARAMS, max_new_tokens=left))
    return drain(fresh)["r"]


def test_a_resumed_request_samples_what_an_uninterrupted_one_does_and_prefills_only_the_new_tokens(model):
    engine = engine_for(model)
    turn1 = first_turn(engine)
    assert engine.stats().parked == 1 and engine.stats().running == 1
    assert engine.resume("r", TOOL) is None
    out = engine.step()  # the resume's prefill: the last sampled token and the tool's output, not the history
    assert out.is_prefill and out.num_tokens == 1 + len(TOOL)
    done = drain(engine)["r"]
    want = uninterrupted(model, turn1)
    n1, n2 = len(turn1), len(TOOL)
    assert done.output_token_ids == turn1 + TOOL + want.output_token_ids
    assert done.loss_mask == [1] * n1 + [0] * n2 + [1] * len(want.output_token_ids)
    assert done.logprobs[n1 : n1 + n2] == [0.0] * n2  # context is never given log-probs
    assert done.logprobs[n1 + n2 :] == pytest.approx(want.logprobs, abs=1e-4)
    assert done.reprefill_tokens == 0


def test_a_park_token_parks_the_request(model):
    ref = engine_for(model)
    ref.add_request("r", PROMPT, PARAMS)
    tokens = drain(ref)["r"].output_token_ids
    park = tokens[5]
    stop_at = tokens.index(park) + 1
    engine = engine_for(model)
    engine.add_request("r", PROMPT, replace(PARAMS, park_token_ids=(park,)))
    parked_after = None
    for _ in range(40):
        out = engine.step()
        if "r" in out.parked:
            parked_after = len(engine.progress("r")[0])
            break
    assert parked_after == stop_at
    assert not engine.step().new_tokens  # parked: nothing runs until it resumes
    engine.resume("r", TOOL)
    assert drain(engine)["r"].output_token_ids[:stop_at] == tokens[:stop_at]


def test_parked_requests_give_their_blocks_up_under_pressure_and_still_resume_exactly(model):
    roomy = engine_for(model)
    turn1 = first_turn(roomy)
    roomy.resume("r", TOOL)
    expected = drain(roomy)["r"]

    tight = engine_for(model, num_kv_blocks=8, block_size=8)  # 64 slots
    assert first_turn(tight) == turn1
    tight.add_request("hog", [5] * 20, replace(PARAMS, max_new_tokens=25))  # needs r's blocks
    while "hog" not in drain_some(tight):
        pass
    assert tight.stats().num_preemptions > 0
    tight.resume("r", TOOL)
    got = drain(tight)["r"]
    assert got.output_token_ids == expected.output_token_ids
    assert got.logprobs == pytest.approx(expected.logprobs, abs=1e-4)
    assert tight.stats().kv_blocks_used == 0


def drain_some(engine) -> set[str]:
    return {f.request_id for f in engine.step().finished}


def test_a_parked_request_moves_to_another_engine_and_resumes_there(model):
    roomy = engine_for(model)
    turn1 = first_turn(roomy)
    roomy.resume("r", TOOL)
    expected = drain(roomy)["r"]

    src, dst = engine_for(model), engine_for(model)
    first_turn(src)
    moved = pickle.loads(pickle.dumps(src.export_request("r")))
    assert moved.parked and moved.output_token_ids == turn1
    dst.import_request(moved)
    assert dst.stats().parked == 1 and not dst.step().new_tokens
    dst.resume("r", TOOL)
    got = drain(dst)["r"]
    assert got.output_token_ids == expected.output_token_ids
    assert got.loss_mask == expected.loss_mask


def test_resume_errors_name_the_request(model):
    engine = engine_for(model)
    engine.add_request("r", PROMPT, PARAMS)
    with pytest.raises(KeyError, match="not parked"):
        engine.resume("r", TOOL)
    engine.park("r")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.resume("r", [10**6])
    long = engine.resume("r", [3] * engine.max_model_len)
    assert long is not None and long.finish_reason == "length" and not engine.has_unfinished()
