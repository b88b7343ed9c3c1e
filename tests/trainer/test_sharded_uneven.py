"""Sharded ranks given different numbers of micro-batches, with the KL term on: the rank that runs out of work
must still run every sharded module (the policy and the reference) as often as the busiest rank, or the other
ranks wait forever in an all-gather. 2 and 3 gloo ranks against the single-process trainer."""

from __future__ import annotations

import random

import pytest
from safetensors.torch import load_file

from laminar.config import TrainerConfig
from laminar.data.records import Trajectory
from laminar.trainer.trainer import Trainer
from tests.gloo_ranks import run_ranks
from tests.trainer.sharded_ranks import uneven_main
from tests.trainer.test_sharded import VOCAB, model

UNEVEN_CFG = TrainerConfig(lr=1e-3, micro_batch=2, kl_coef=0.5)


def uneven_batch() -> list[list[Trajectory]]:
    """Two groups: one long response and many short ones. Balanced by tokens, the long one fills a
    rank alone (one micro-batch) while the short ones make several micro-batches on the others."""
    rng = random.Random(7)
    groups = []
    for g in range(2):
        prompt = [1] + [rng.randrange(3, VOCAB) for _ in range(4)]
        group = []
        for i in range(8):
            n = 60 if (g, i) == (0, 0) else rng.randint(2, 5)
            resp = [rng.randrange(3, VOCAB) for _ in range(n)]
            lp = [-rng.uniform(1.5, 4.0) for _ in resp]
            group.append(Trajectory(f"{g}:{i}", g, i, prompt, resp, lp, 0, reward=float(i % 3 == 0)))
        groups.append(group)
    return groups


@pytest.mark.parametrize("world", [2, 3])
def test_uneven_micro_batches_with_kl_finish_and_match_one_process(world, request, tmp_path):
    ref = Trainer(UNEVEN_CFG, model=model())
    m = ref.train_step(uneven_batch())
    assert m["kl"] >= 0
    if world == 2:  # the session's two ranks ran it (tests/trainer/conftest.py)
        out = request.getfixturevalue("two_ranks") / "uneven"
    else:  # a hang fails at the deadline (gloo's own timeout is a minute in the ranks)
        out = tmp_path
        run_ranks(uneven_main, (str(out),), world, "uneven micro-batches and KL")
    got = load_file(str(out / "params.safetensors"))
    counts = [int((out / f"micro{r}.txt").read_text()) for r in range(world)]
    assert len(set(counts)) > 1, counts  # the ranks really had different amounts of work
    assert got["metric.loss"].tolist()[1] == sum(max(counts) - c for c in counts)  # each gap filled, reported
    for k, v in ref.model.state_dict().items():
        if k != "lm_head.weight":
            assert float((got[k] - v).abs().max()) <= 1e-5, k
    assert got["metric.loss"].tolist()[0] == pytest.approx(m["loss"], abs=1e-5)
