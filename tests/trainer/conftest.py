"""The trainer tests' two gloo ranks, spawned once a session: every 2-rank check reads what its job wrote there
(`sharded_ranks.two_rank_main`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.gloo_ranks import run_ranks


@pytest.fixture(scope="session")
def single(tmp_path_factory):
    """The single-process trainer after one step on `test_sharded.batch()`, its metrics and its checkpoint."""
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import CFG, batch, model

    tr = Trainer(CFG, model=model())
    m = tr.train_step(batch())
    ckpt = tr.save_checkpoint(tmp_path_factory.mktemp("single") / "ckpt")
    return tr, m, ckpt


@pytest.fixture(scope="session")
def two_ranks(single, tmp_path_factory) -> Path:
    """The folder where the two ranks' jobs wrote their results, a folder each."""
    from tests.trainer.sharded_ranks import two_rank_main

    out = tmp_path_factory.mktemp("two-ranks")
    run_ranks(two_rank_main, (str(out), str(single[2])), 2, "every 2-rank job")
    return out
