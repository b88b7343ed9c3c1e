"""What the ranks of the trainer tests' gloo groups do: spawned processes, so no Ray. Results go back as
safetensors files (no pickles). Every 2-rank check's step runs in one spawn of two processes (`two_rank_main`,
started once a session by tests/trainer/conftest.py), each job in its own folder: a rank's start-up, torch and
the trainer imported, is most of its cost."""

from __future__ import annotations

import sys
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.gloo_ranks import finish_rank

ROOT = str(Path(__file__).resolve().parents[2])


def join_group(rank: int, world: int, port: int) -> None:
    """A hang (a rank left waiting in a collective) fails in a minute, not gloo's default half hour."""
    sys.path.insert(0, ROOT)
    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )


def two_rank_main(rank: int, world: int, port: int, out: str, single_ckpt: str) -> None:
    """Every 2-rank job in turn: `sharded_steps` (test_sharded), `algorithm_step` of each algorithm
    (test_sharded_algorithms), `truncated_step` (test_truncated_logprobs), `uneven_step` (test_sharded_uneven)."""
    join_group(rank, world, port)
    try:
        from tests.trainer.test_sharded_algorithms import ALGORITHMS

        sharded_steps(rank, world, Path(out) / "sharded", single_ckpt)
        for name in sorted(ALGORITHMS):
            algorithm_step(rank, world, Path(out) / "algorithms" / name, name)
        truncated_step(rank, world, Path(out) / "truncated")
        uneven_step(rank, world, Path(out) / "uneven")
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()


def uneven_main(rank: int, world: int, port: int, out: str) -> None:
    """`uneven_step` alone, for a group of another size."""
    join_group(rank, world, port)
    try:
        uneven_step(rank, world, Path(out))
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()


def save_gathered(full: dict[str, torch.Tensor], path: Path, **metrics: list[float]) -> None:
    """Rank 0's file: the gathered parameters, and each metric list as a tensor named `metric.NAME`."""
    tensors = {k: v.contiguous() for k, v in full.items()}
    save_file(tensors | {f"metric.{k}": torch.tensor(v) for k, v in metrics.items()}, str(path))


def sharded_steps(rank: int, world: int, out: Path, single_ckpt: str) -> None:
    """A step from the start, saved to `out/ckpt` (its published versions beside); a step from that 2-rank
    checkpoint (`out/resumed-two`); and a step from the single-process trainer's checkpoint (`out/resumed-one`)."""
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import CFG, batch, model

    out.mkdir(parents=True, exist_ok=True)
    tr = Trainer(CFG, model=model(), rank=rank, world=world)
    publish(tr, out / "published0.bin", rank)  # version 0: the starting weights
    metrics = tr.train_step(batch())
    tr.save_checkpoint(out / "ckpt")
    publish(tr, out / "published.bin", rank)
    full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
    tr.publish_dtype = "bfloat16"  # each rank's rows cast into one buffer, as on a GPU
    publish(tr, out / "published-bf16.bin", rank)
    # inf in rank 1's rows only: both ranks refuse to publish, naming the parameter
    nonfinite(tr, out / f"nonfinite{rank}.txt", rank)
    if rank == 0:
        save_gathered(
            full, out / "params.safetensors", loss=[metrics["loss"], metrics["grad_norm"], metrics["tokens"]]
        )
    for ckpt, where in ((out / "ckpt", "resumed-two"), (Path(single_ckpt), "resumed-one")):
        tr = Trainer(CFG, model=model(), rank=rank, world=world)
        tr.load_checkpoint(ckpt)
        tr.train_step(batch())
        full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
        if rank == 0:
            (out / where).mkdir()
            save_gathered(full, out / where / "params.safetensors")


def publish(tr, flat: Path, rank: int) -> None:  # noqa: ANN001 - a Trainer
    """What the runtime's publish does: every rank writes its rows into one flat file rank 0 made."""
    from laminar.engine.layout import WeightLayout
    from laminar.relay.publisher import ShardWriter

    shards, flag = tr.publish_parts()
    layout = WeightLayout.of_specs([(s.name, s.shape, s.dtype) for s in shards])
    if rank == 0:
        flat.write_bytes(b"\0" * layout.total_bytes)
    dist.barrier()
    ShardWriter().write(str(flat), layout, shards)
    tr.raise_nonfinite(flag, summary=True)  # the ranks agree, and have all written


def nonfinite(tr, out: Path, rank: int) -> None:  # noqa: ANN001 - a Trainer
    from laminar.trainer.finite import NonFiniteError

    p = dict(tr.model.named_parameters())["model.layers.0.mlp.up_proj.weight"]
    if rank == 1:
        with torch.no_grad():
            p.to_local()[0, 0] = float("inf")
    try:
        tr.raise_nonfinite(tr.publish_parts()[1], summary=True)
        out.write_text("published")
    except NonFiniteError as e:
        out.write_text(str(e))


def uneven_step(rank: int, world: int, out: Path) -> None:
    """One step on `uneven_batch()` with the KL term on; writes how many real micro-batches this rank ran."""
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import model
    from tests.trainer.test_sharded_uneven import UNEVEN_CFG, uneven_batch

    out.mkdir(parents=True, exist_ok=True)
    tr = Trainer(UNEVEN_CFG, model=model(), rank=rank, world=world)
    groups = uneven_batch()
    plan = tr.plan([t.num_tokens for g in groups for t in g])
    (out / f"micro{rank}.txt").write_text(str(sum(m is not None for _, mbs in plan for m in mbs)))
    metrics = tr.train_step(groups)
    full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
    if rank == 0:
        save_gathered(full, out / "params.safetensors", loss=[metrics["loss"], metrics["idle_passes"]])


def algorithm_step(rank: int, world: int, out: Path, name: str) -> None:
    """One step of `test_sharded_algorithms.ALGORITHMS[name]` on `test_sharded.batch()`: the gathered parameters
    and the loss (and a critic's, with a checkpoint of both ranks)."""
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import batch, model
    from tests.trainer.test_sharded_algorithms import ALGORITHMS

    out.mkdir(parents=True, exist_ok=True)
    tr = Trainer(**ALGORITHMS[name], model=model(), rank=rank, world=world)
    metrics = tr.train_step(batch())
    full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
    losses = [metrics["loss"]]
    if tr.critic is not None:  # its gathered weights, its metrics, and a checkpoint of both ranks
        full |= {f"critic.{k}": v.full_tensor() for k, v in tr.critic.model.state_dict().items()}
        losses += [metrics["value_loss"], metrics["value_grad_norm"]]
        tr.save_checkpoint(out / "ckpt")
    if rank == 0:
        save_gathered(full, out / "params.safetensors", loss=losses)


def truncated_step(rank: int, world: int, out: Path) -> None:
    """One step under truncation (policy and KL reference sharded): the updated parameters and the loss."""
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import CFG, batch, model
    from tests.trainer.test_truncated_logprobs import TRUNCATED

    out.mkdir(parents=True, exist_ok=True)
    tr = Trainer(CFG, rollout=TRUNCATED, model=model(), rank=rank, world=world)
    loss = tr.train_step(batch())["loss"]
    full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
    if rank == 0:
        save_gathered(full, out / "params.safetensors", loss=[loss])
