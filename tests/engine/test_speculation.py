"""Grouped speculative decoding (`drafter.py`, `Engine._verify`): drafts from the group's text, verified in one
decode step, sampled exactly.

A verify row draws the token a plain decode step draws at that position, so with the same seeds a request samples
the same tokens and log-probs with speculation on as off (checked token for token, through stops, parks, moves
and preemption); the distribution is checked against the model's exact one (chi-square on whole short samples,
at temperature 1 and with top-p), and the check is shown to fail for a wrong acceptance rule."""

from __future__ import annotations

import dataclasses
import gc
import itertools
import math

import pytest
import torch

import laminar.engine.speculative as speculative_module
from laminar.engine import SamplingParams
from laminar.engine.config import Speculation
from laminar.engine.drafter import Drafter, GroupText, next_draft_len
from laminar.engine.sampler import accepted_prefix, keep_threshold
from tests.tiny import tiny_llama

from .helpers import drain, engine_for, hf_model

ON, OFF, AUTO = Speculation("on"), Speculation("off"), Speculation("auto")


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: more threads only contend (the statistical runs take seconds instead of minutes)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def successor_model(vocab: int = 32, scale: float = 7.0, seed: int = 0):
    """A tiny Llama whose next token is mostly a fixed function of the last (t -> 5t + 3 mod vocab, about 19
    times in 20 at temperature 1), so a group's samples keep repeating each other's text. Its attention and MLP
    add a little of the context to every logit, so the cache it reads matters."""
    model = tiny_llama(
        vocab,
        seed,
        eager=True,
        hidden_size=vocab,
        num_attention_heads=4,
        max_position_embeddings=256,
        eos_token_id=1,
        initializer_range=0.05,
        tie_word_embeddings=False,
    ).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(vocab) + 0.05 * torch.randn(vocab, vocab))
        nxt = (torch.arange(vocab) * 5 + 3) % vocab
        head = torch.zeros(vocab, vocab)
        head[nxt, torch.arange(vocab)] = scale / math.sqrt(vocab)
        model.lm_head.weight.copy_(head + 0.02 * torch.randn(vocab, vocab))
    return model


@pytest.fixture(scope="module")
def succ():
    return successor_model()


@pytest.fixture(scope="module")
def rand():
    return hf_model("qwen2")


class StepClock:
    """A gate's clock (`gate.py`) that a plain decode step advances by `plain` and a verify step by `verify`,
    read off the engine's counters at each step's end: auto's decisions without real timing."""

    def __init__(self, engine, plain: float = 1.0, verify: float = 2.0) -> None:
        self.engine, self.plain, self.verify = engine, plain, verify
        self.now, self.seen = 0.0, (0, 0)

    def __call__(self) -> float:
        e = self.engine
        decode, verify = e.decode_steps - self.seen[0], e.verify_steps - self.seen[1]
        self.now += (decode - verify) * self.plain + verify * self.verify
        self.seen = (e.decode_steps, e.verify_steps)
        return self.now


def spec_engine(model, speculation, costs=(1.0, 2.0), **kw):
    """An engine whose gate (if any) times steps by `costs` = (plain, verify) seconds a step (`StepClock`)."""
    e = engine_for(model, speculation=speculation, **kw)
    if e.gate is not None:
        e.gate.clock = StepClock(e, *costs)
    return e


def group_run(model, speculation, prompts, n, params, max_num_seqs=4, **kw) -> tuple[dict, object]:
    """`n` samples of each prompt (seeds 0..n-1; without `ignore_eos` in `params`, EOS ends every other one),
    run to the end; the finished requests and the stats."""
    e = spec_engine(model, speculation, max_num_seqs=max_num_seqs, **kw)
    for g, prompt in enumerate(prompts):
        for i in range(n):
            e.add_request(
                f"g{g}-{i}", prompt, SamplingParams(**{"ignore_eos": i % 2 == 0, **params, "seed": i})
            )
    return drain(e), e.stats()


def assert_same(done: dict, other: dict) -> None:
    assert done.keys() == other.keys()
    for rid, f in done.items():
        g = other[rid]
        assert f.output_token_ids == g.output_token_ids, rid
        assert f.finish_reason == g.finish_reason, rid
        assert f.loss_mask == g.loss_mask, rid
        assert max((abs(a - b) for a, b in zip(f.logprobs, g.logprobs)), default=0.0) < 1e-5, rid


# ---- the acceptance rule and the drafter ---------------------------------------------------------------------
def test_accepted_prefix():
    assert accepted_prefix([4, 5, 6], [4, 5, 7, 9]) == 2
    assert accepted_prefix([4, 5, 6], [4, 5, 6, 9]) == 3
    assert accepted_prefix([4], [3, 9]) == 0
    assert accepted_prefix([], [9]) == 0


def test_drafts_follow_the_group_text():
    prompt = [1, 2, 3]
    drafter = Drafter()
    a, b = prompt + [4, 5, 6, 7, 8], prompt + [4, 5]
    ga, sa = drafter.join("a", a, 3)
    gb, sb = drafter.join("b", b, 3)
    assert ga is gb and len(drafter.groups) == 1
    ga.catch_up()
    assert ga.propose(sb, 2) == [6, 7]
    assert ga.propose(sb, 10) == [6, 7, 8]  # a's continuation runs out at its last token
    assert ga.propose(sa, 3) == []  # nothing else continues a's end
    a += [9, 10]  # a stream followed is read as it is now
    assert ga.propose(sb, 10) == [6, 7, 8, 9, 10]
    b += [7, 8, 9]  # a match in tokens that arrived: found once the index catches up
    assert ga.propose(sb, 10) == []
    ga.catch_up()
    assert ga.propose(sb, 10) == [10]
    # the prompt is text too: a fresh sample drafts the others' opening
    gc, sc = drafter.join("c", list(prompt), 3)
    gc.catch_up()
    assert gc.propose(sc, 2) == [4, 5]


def test_drafts_vote_and_prefer_the_longest_match():
    drafter = Drafter()
    streams = {"x": [0, 7, 1, 2, 3, 4], "y": [0, 7, 1, 2, 3, 4], "z": [0, 7, 9, 2, 3, 5], "w": [0, 7, 2, 3]}
    group = None
    for rid, tokens in streams.items():
        group, _ = drafter.join(rid, tokens, 2)
    group.catch_up()
    # (2, 3) ends in x, y and z: two of them go on with 4
    assert group.propose(group.slot["w"], 1) == [4]
    streams["w"].append(9)  # w's end (3, 9) continues nowhere
    group.catch_up()
    assert group.propose(group.slot["w"], 1) == []
    v = [0, 7, 9, 2, 3]
    gv, sv = drafter.join("v", v, 2)
    gv.catch_up()
    assert gv.propose(sv, 1) == [5]  # the 4-gram (7, 9, 2, 3) matches z only, over the 2-gram's vote


def test_group_text_outlives_its_requests():
    drafter = Drafter()
    a, b = [1, 2, 3, 4], [1, 2]
    g, sa = drafter.join("a", a, 2)
    _, sb = drafter.join("b", b, 2)
    a.append(5)
    drafter.leave(g, sa, a)  # finished: its text stays for b
    g.catch_up()
    assert g.propose(sb, 3) == [3, 4, 5]
    assert g.members == 1 and drafter.groups
    # a request moved out and back in keeps its stream when it brings the text it left with, not otherwise
    assert drafter.join("a", [1, 2, 3, 4, 5, 6], 2) == (g, sa)
    drafter.leave(g, sa, a)
    assert drafter.join("a", [1, 2, 8, 9], 2)[1] not in (sa, sb)
    drafter.leave(g, 2, a)
    drafter.leave(g, sb, b)
    assert not drafter.groups


def test_the_index_gives_the_garbage_collector_nothing_to_walk_per_ngram():
    """A group's index over 8 texts of 600 tokens (over 1,000 n-grams, 14,000 places) adds a handful of objects
    the garbage collector tracks, not one per n-gram: a full collection over a replica's tail groups stays cheap."""
    gc.collect()
    before = len(gc.get_objects())
    g = GroupText(100)
    texts = [[(7 * i + j * j) % 50 for j in range(600)] for i in range(8)]
    for t in texts[1:]:
        g.add_text(t)
    g.join("r", texts[0])
    g.catch_up()
    assert len(g.index) > 1_000
    gc.collect()
    assert len(gc.get_objects()) - before < 200  # a list of tuples an n-gram: over 1,200
    assert g.propose(0, 4)  # and it still drafts


def test_draft_length_follows_acceptance():
    assert next_draft_len(4, 4, 4, 8) == 6
    assert next_draft_len(7, 7, 7, 8) == 8
    assert next_draft_len(4, 1, 4, 8) == 3
    assert next_draft_len(1, 0, 1, 8) == 1
    g = GroupText(2)
    g.record(0, 4)
    assert g.acceptance == pytest.approx(0.9)
    g.record(3, 3)
    assert g.acceptance > 0.9


# ---- the same samples as plain decoding ----------------------------------------------------------------------
SAMPLINGS = {
    "greedy": {"temperature": 0.0},
    "t1": {"temperature": 1.0},
    "top_p_top_k": {"temperature": 0.8, "top_p": 0.9, "top_k": 12},
}


@pytest.mark.parametrize("mode", [ON, AUTO], ids=["on", "auto"])
@pytest.mark.parametrize("sampling", sorted(SAMPLINGS))
def test_same_samples_as_plain_decoding(succ, rand, sampling, mode):
    """Token for token, log-prob for log-prob, end for end, with stops inside accepted drafts (EOS on for half)
    and length limits; on the model that repeats (many drafts accepted) and on a random one (most rejected)."""
    prompts = [[5, 9, 14, 3], [7, 7, 2]]
    for model, accepts in ((succ, True), (rand, False)):
        params = {"max_new_tokens": 32, **SAMPLINGS[sampling]}
        on, stats = group_run(model, mode, prompts, 6, params)
        off, plain = group_run(model, OFF, prompts, 6, params)
        assert_same(on, off)
        assert plain.draft_tokens == 0 and stats.draft_tokens > 0
        if accepts:
            assert any(f.finish_reason == "stop" for f in on.values())
            assert stats.accepted_tokens > stats.draft_tokens / 2, stats
            assert stats.decode_steps < plain.decode_steps


def test_logprobs_are_a_plain_forwards(succ):
    """Each recorded log-prob is the model's (a Hugging Face forward over prompt plus output), at the request's
    temperature, after its top-k/top-p cut and renormalised, to 1e-5 in fp32."""
    prompt = [5, 9, 14, 3]
    for params in (
        {"temperature": 1.0},
        {"temperature": 0.7, "top_p": 0.85, "top_k": 10},
        {"temperature": 0.0},
    ):
        p = {"max_new_tokens": 30, "ignore_eos": True, **params}
        done, stats = group_run(succ, ON, [prompt], 6, p, max_num_seqs=2)
        assert stats.accepted_tokens > 0
        t = params["temperature"] or 1.0
        for f in done.values():
            ids = torch.tensor([prompt + f.output_token_ids])
            with torch.no_grad():
                scaled = succ(ids).logits[0, len(prompt) - 1 : -1].float() / t
            if params.get("top_p", 1.0) < 1 or params.get("top_k", 0):
                rows = len(scaled)
                cut = keep_threshold(
                    scaled,
                    torch.full((rows,), params.get("top_k", 0)),
                    torch.full((rows,), params.get("top_p", 1.0)),
                )
                scaled = scaled.masked_fill(scaled < cut[:, None], float("-inf"))
            want = scaled.log_softmax(-1).gather(1, torch.tensor(f.output_token_ids)[:, None])[:, 0]
            assert torch.allclose(torch.tensor(f.logprobs), want, atol=1e-5), (f.request_id, f.logprobs)


def test_a_group_that_repeats_accepts_its_drafts(succ):
    """The tail: a group's samples run a few at a time, later ones after earlier ones finished; on the model
    that repeats itself most draft tokens are accepted and a verified request gains several tokens a step."""
    params = {"temperature": 1.0, "max_new_tokens": 48, "ignore_eos": True}
    _, stats = group_run(succ, ON, [[5, 9, 14, 3]], 8, params, max_num_seqs=2)
    assert stats.verify_steps > 0 and stats.draft_rows > 0
    acceptance = stats.accepted_tokens / stats.draft_tokens
    tokens_per_verify = stats.verify_tokens / stats.draft_rows
    assert acceptance > 0.5, stats
    assert tokens_per_verify > 2.0, stats
    assert stats.draft_s > 0


# ---- the distribution ----------------------------------------------------------------------------------------
SMALL_VOCAB, NEW = 8, 4
SMALL_PROMPT = [3, 5, 2, 7, 3, 5]


@pytest.fixture(scope="module")
def small():
    """A random tiny Llama of 8 tokens: 4 tokens of it have 4,096 outcomes, spread enough to test whole."""
    return tiny_llama(
        SMALL_VOCAB,
        eager=True,
        num_attention_heads=4,
        eos_token_id=1,
        initializer_range=0.5,
        tie_word_embeddings=False,
    ).eval()


def exact_probs(model, temperature: float, top_p: float) -> dict[tuple[int, ...], float]:
    """The probability of every 4-token answer to SMALL_PROMPT, position by position through the top-p cut."""
    answers = torch.tensor(list(itertools.product(range(SMALL_VOCAB), repeat=NEW)))
    ids = torch.cat([torch.tensor(SMALL_PROMPT).expand(len(answers), -1), answers], 1)
    with torch.no_grad():
        rows = (model(ids).logits[:, len(SMALL_PROMPT) - 1 : -1].float() / temperature).reshape(
            -1, SMALL_VOCAB
        )
    cut = keep_threshold(rows, torch.zeros(len(rows), dtype=torch.int64), torch.full((len(rows),), top_p))
    logp = rows.masked_fill(rows < cut[:, None], float("-inf")).log_softmax(-1).reshape(len(answers), NEW, -1)
    probs = logp.gather(2, answers[..., None])[..., 0].sum(-1).exp()
    return {tuple(a): p for a, p in zip(answers.tolist(), probs.tolist())}


def chi_square(samples: list[tuple[int, ...]], probs: dict) -> tuple[float, int, float]:
    """Pearson's statistic over the answers expected at least 5 times (the rest pooled in one cell), its degrees
    of freedom and p-value."""
    n, counts = len(samples), {}
    for s in samples:
        counts[s] = counts.get(s, 0) + 1
    stat, cells, rest_seen, rest_expected = 0.0, 0, 0, 0.0
    for answer, p in probs.items():
        expected, seen = n * p, counts.get(answer, 0)
        if expected >= 5:
            stat += (seen - expected) ** 2 / expected
            cells += 1
        else:
            rest_seen, rest_expected = rest_seen + seen, rest_expected + expected
    if rest_expected > 0:
        stat += (rest_seen - rest_expected) ** 2 / rest_expected
        cells += 1
    df = cells - 1
    p = torch.special.gammaincc(
        torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return stat, df, float(p)


def sample_small(model, n: int, temperature: float, top_p: float):
    """`n` samples of SMALL_PROMPT (one group, 32 at a time, drafts of up to 2 tokens plus the draw after)."""
    e = engine_for(model, speculation=ON, max_num_seqs=32, max_model_len=64)
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=NEW, ignore_eos=True, seed=0)
    for i in range(n):
        e.add_request(f"s{i}", SMALL_PROMPT, params)
    return [tuple(f.output_token_ids) for f in drain(e).values()], e.stats()


# Threshold on the p-value. A wrong rule lands far below it: at 4,096 samples always accepting gives p = 0 (to
# double precision), a rejection that may emit the draft token again p < 1e-150. The right one falls below it
# about once in a million: the statistic on 20,000 multinomial draws of 2,048 from the exact probabilities put
# 5% of p-values below 0.05 and 0.015% below 1e-4, none below 9e-6; the engine with 100 other seeds, 5-6% below
# 0.05, none below 5e-3.
P_MIN = 1e-6


@pytest.mark.parametrize("top_p", [1.0, 0.8])
def test_distribution_matches_the_model(small, top_p):
    samples, stats = sample_small(small, 2048, 1.0, top_p)
    stat, df, p = chi_square(samples, exact_probs(small, 1.0, top_p))
    assert p > P_MIN, (stat, df, p)
    # drafts were both accepted and rejected, often
    assert 0.2 * stats.draft_tokens < stats.accepted_tokens < 0.8 * stats.draft_tokens, stats


def test_a_wrong_acceptance_rule_fails_the_distribution_test(small, monkeypatch):
    """The same check with every draft token accepted (the draws after a wrong token are kept): rejected."""
    monkeypatch.setattr(speculative_module, "accepted_prefix", lambda draft, sampled: len(draft))
    samples, _ = sample_small(small, 2048, 1.0, 1.0)
    _, _, p = chi_square(samples, exact_probs(small, 1.0, 1.0))
    assert p < P_MIN


# ---- moves, tool turns, preemption, auto ---------------------------------------------------------------------
def moved_run(model, move: bool, speculation=ON) -> dict:
    """A group of 6 on the repeating model, speculating, with a park token (resumed with two context tokens
    three steps later). With `move`: once verify steps have run, one request is exported with its keys and
    values to a second engine, one without them and back into the same engine, and one while parked (into the
    second engine, resumed there)."""
    params = {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True, "park_token_ids": (20,)}
    a, b = (
        spec_engine(model, speculation, max_num_seqs=4),
        spec_engine(model, speculation, max_num_seqs=4),
    )
    for i in range(6):
        a.add_request(f"r{i}", [5, 9, 14, 3], SamplingParams(**{**params, "seed": i}))
    done, parked, moved, step = {}, {}, set(), 0
    while a.has_unfinished() or b.has_unfinished():
        step += 1
        for e in (a, b):
            out = e.step()
            done.update({f.request_id: f for f in out.finished})
            for rid in out.parked:
                parked[rid] = (e, step + 3)
        for rid, (e, at) in list(parked.items()):
            if step >= at:
                fin = e.resume(rid, [7, 9])
                if fin is not None:
                    done[rid] = fin
                del parked[rid]
        if not move or a.stats().verify_steps == 0:
            continue
        live = {rid: a._seqs[rid] for rid in a._seqs}
        for rid, seq in live.items():
            if rid in moved or seq.num_output < 8:
                continue
            if seq.parked and rid in parked and "parked" not in moved:
                b.import_request(a.export_request(rid, with_kv=True))
                parked[rid] = (b, parked[rid][1])
                moved |= {rid, "parked"}
            elif not seq.parked and "kv" not in moved:
                b.import_request(a.export_request(rid, with_kv=True))
                moved |= {rid, "kv"}
            elif not seq.parked and "re-prefill" not in moved:
                a.import_request(a.export_request(rid))
                moved |= {rid, "re-prefill"}
    if move:
        assert {"kv", "re-prefill"} <= moved, moved
    return done


@pytest.mark.parametrize("mode", [ON, AUTO], ids=["on", "auto"])
def test_moves_and_tool_turns_mid_speculation(succ, mode):
    """Exported and imported (with and without its keys and values, running or parked) and parked and resumed
    while speculating, a request ends exactly as the same request never moved."""
    still, moved = moved_run(succ, move=False, speculation=mode), moved_run(succ, move=True, speculation=mode)
    assert_same(moved, still)
    assert any(f.loss_mask and 0 in f.loss_mask for f in still.values())  # some resumed with context


def test_a_moved_request_takes_its_group_text_along(succ):
    """Repack moves tail requests away from their finished siblings: the export carries the siblings' text
    (`group_text`), the importer drafts from it, and the request still samples exactly what it would have.
    Engines that do not speculate neither send nor use it."""
    params = {"temperature": 1.0, "ignore_eos": True}
    prompt = [5, 9, 14, 3]

    def exported(speculation):
        a = spec_engine(succ, speculation, max_num_seqs=4)
        for i in range(3):
            a.add_request(f"r{i}", prompt, SamplingParams(**params, seed=i, max_new_tokens=24))
        a.add_request("tail", prompt, SamplingParams(**params, seed=3, max_new_tokens=64))
        siblings = {}
        while len(siblings) < 3:
            siblings.update({f.request_id: f.output_token_ids for f in a.step().finished})
        return a.export_request("tail"), siblings

    e, siblings = exported(ON)
    assert sorted(map(tuple, e.group_text)) == sorted(map(tuple, siblings.values()))
    assert exported(OFF)[0].group_text == []

    def continued(moved, speculation):
        b = spec_engine(succ, speculation, max_num_seqs=4)
        b.import_request(moved)
        return drain(b)["tail"], b.stats()

    plain = spec_engine(succ, OFF, max_num_seqs=4)
    plain.add_request("tail", prompt, SamplingParams(**params, seed=3, max_new_tokens=64))
    want = drain(plain)
    alone = dataclasses.replace(e, group_text=[])
    (with_text, stats), (without, bare) = continued(e, ON), continued(alone, ON)
    assert_same({"tail": with_text}, want)
    assert_same({"tail": without}, want)
    assert_same({"tail": continued(e, OFF)[0]}, want)
    # the siblings' text gives the moved request drafts it could not make from its own
    assert stats.accepted_tokens > bare.accepted_tokens, (stats, bare)
    assert stats.decode_steps < bare.decode_steps, (stats, bare)
    # a text that came with an earlier move is not indexed twice
    g = GroupText(2)
    g.add_text([1, 2, 3, 4])
    g.add_text([1, 2, 3, 4])
    assert len(g.streams) == 1 and g.texts(5) == [[3, 4]]


def test_preemption_and_short_blocks(succ):
    """Blocks of 4 tokens (drafts cross block ends; rejected ones' blocks go back) and too few of them (requests
    preempted and re-prefilled): the same samples as without speculation."""
    params = {"temperature": 1.0, "max_new_tokens": 36, "ignore_eos": True}
    kw = {"block_size": 4, "num_kv_blocks": 40, "max_num_seqs": 6}
    on, stats = group_run(succ, ON, [[5, 9, 14, 3]], 8, params, **kw)
    off, plain = group_run(succ, OFF, [[5, 9, 14, 3]], 8, params, **kw)
    assert_same(on, off)
    assert stats.num_preemptions > 0 and stats.accepted_tokens > 0
    assert stats.kv_blocks_used == 0


def test_auto_drafts_only_for_small_batches_that_accept(succ):
    params = {"temperature": 1.0, "max_new_tokens": 32, "ignore_eos": True}
    auto = Speculation("auto", max_batch=4, min_acceptance=0.5)
    # small batches of a group that repeats: drafts, and the same samples as off (pipelined where no step drafts)
    on, stats = group_run(succ, auto, [[5, 9, 14, 3]], 8, params, max_num_seqs=2, pipeline=True)
    off, _ = group_run(succ, OFF, [[5, 9, 14, 3]], 8, params, max_num_seqs=2)
    assert_same(on, off)
    assert stats.accepted_tokens > stats.draft_tokens / 2
    # a batch above max_batch never drafts, and its decode steps queue ahead as without speculation
    _, big = group_run(succ, auto, [[5, 9, 14, 3]], 8, params, max_num_seqs=8, pipeline=True)
    assert big.draft_tokens == 0 and big.queued_ahead > 0
    # a group whose drafts mostly fail: its rate falls below min_acceptance and drafting stops, while the
    # drafter's guesses keep the rate current
    weak = successor_model(scale=3.0)
    low_done, low = group_run(weak, auto, [[5, 9, 14, 3]], 8, params, max_num_seqs=4, pipeline=True)
    always_done, always = group_run(weak, ON, [[5, 9, 14, 3]], 8, params, max_num_seqs=4)
    assert_same(low_done, always_done)
    assert always.accepted_tokens < always.draft_tokens / 3, always
    assert low.draft_tokens < always.draft_tokens / 3, (low, always)
    assert low.queued_ahead > 0 and low.draft_s > 0


def test_auto_follows_the_measured_cost(succ):
    """The same run on the model that repeats (most drafts accepted), with a verify step timed at 1.25 plain
    steps and at 20: the gate chooses verifying for most steps in the first and plain decoding in the second (acceptance alone would verify as
    often in both), and the samples are the same as off either way."""
    params = {"temperature": 1.0, "max_new_tokens": 40, "ignore_eos": True}
    kw = {"max_num_seqs": 2, "pipeline": True}
    runs = {
        cost: group_run(succ, AUTO, [[5, 9, 14, 3]], 8, params, costs=(1.0, cost), **kw)
        for cost in (1.25, 20)
    }
    off, _ = group_run(succ, OFF, [[5, 9, 14, 3]], 8, params, max_num_seqs=2)
    for done, _ in runs.values():
        assert_same(done, off)
    cheap, dear = runs[1.25][1], runs[20][1]
    chose = {cost: stats.gate_steps for cost, (_, stats) in runs.items()}
    assert chose[1.25]["verify"] > 4 * (chose[1.25]["plain"] + chose[1.25]["explore_plain"]), chose
    assert chose[20]["plain"] > 8 * (chose[20]["verify"] + chose[20]["explore_verify"]), chose
    assert chose[20]["explore_verify"] > 0 and chose[1.25]["explore_plain"] > 0, chose
    assert dear.verify_steps < cheap.verify_steps / 2 and dear.decode_steps > 2 * cheap.decode_steps
    assert dear.queued_ahead > cheap.queued_ahead
    assert None not in dear.gate_ms_per_token["2-3"].values()


def test_auto_turns_off_when_acceptance_collapses_and_on_when_it_recovers(succ):
    """A group on a random model's weights (its samples' texts unrelated): drafts stop being accepted and the
    steps go plain; the repeating model's weights loaded mid-run: drafts are accepted again and steps verify."""
    params = SamplingParams(temperature=1.0, max_new_tokens=200, ignore_eos=True)
    noise = successor_model(scale=0.0, seed=3)
    e = spec_engine(succ, AUTO, max_num_seqs=4, max_model_len=256)
    e.load_state_dict(noise.state_dict(), version=1)
    for i in range(4):
        e.add_request(f"r{i}", [5, 9, 14, 3], SamplingParams(**{**params.__dict__, "seed": i}))

    def verify_share(steps: int) -> float:
        before = e.stats()
        for _ in range(steps):
            e.step()
        s = e.stats()
        return (s.verify_steps - before.verify_steps) / (s.decode_steps - before.decode_steps)

    verify_share(20)  # the optimistic start: drafts tried, then their rate falls
    collapsed = verify_share(40)
    e.load_state_dict(succ.state_dict(), version=2)
    verify_share(60)  # guesses raise the group's rate; the gate explores verifying and measures it paying
    recovered = verify_share(40)
    assert collapsed < 0.15 and recovered > 0.7, (collapsed, recovered, e.stats())
