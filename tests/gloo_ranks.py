"""How a test starts its gloo ranks and how a spawned rank ends (`torch.multiprocessing`, no Ray)."""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def join_gloo(rank: int, world: int, port: int, timeout_s: float = 60.0) -> None:
    """Join a spawned test's gloo group on this machine, one torch thread a rank (two ranks share two cores)."""
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=timeout_s),
    )


def finish_rank() -> None:
    """Leave a rank that has written its results: every rank reaches the barrier before any tears the group down,
    then the process ends at once, without the interpreter's exit. A rank whose work was done, its results
    written, has died of SIGABRT ("terminate called without an active exception") when gloo's threads met the
    interpreter's teardown (twice in a day of runs on the 2-core box): a test failure that was no failure of the
    code under test."""
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


DEADLINE_S = 240  # a hang fails here rather than at gloo's own timeout


def run_ranks(main, args: tuple, world: int, what: str) -> None:  # noqa: ANN001 - a rank's function
    """`main(rank, world, port, *args)` on `world` spawned ranks, failing the test at `DEADLINE_S`."""
    import pytest
    import torch.multiprocessing as mp

    from tests.trainer.test_sharded import free_port

    ctx = mp.start_processes(main, args=(world, free_port(), *args), nprocs=world, join=False)
    deadline = time.monotonic() + DEADLINE_S
    while not ctx.join(timeout=1.0):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail(f"{world} gloo ranks ({what}) did not finish in {DEADLINE_S}s")
