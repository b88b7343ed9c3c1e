"""What each rank of a 2-rank gloo trainer does in `test_sharded`: spawned processes, so no Ray. Results go
back as safetensors files (no pickles)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from tests.gloo_ranks import finish_rank


def rank_main(rank: int, world: int, port: int, out: str, single_ckpt: str) -> None:
    """Three jobs in one spawn (a rank's start-up, torch and the trainer imported, is most of its cost): a step
    from the start, saved to `out/ckpt`; a step from that 2-rank checkpoint (`out/resumed-two`); and a step from
    the single-process trainer's checkpoint (`out/resumed-one`)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import CFG, batch, model

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        tr = Trainer(CFG, model=model(), rank=rank, world=world)
        publish(tr, Path(out) / "published0.bin", rank)  # version 0: the starting weights
        metrics = tr.train_step(batch())
        tr.save_checkpoint(Path(out) / "ckpt")
        publish(tr, Path(out) / "published.bin", rank)
        full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
        tr.publish_dtype = "bfloat16"  # each rank's rows cast into one buffer, as on a GPU
        publish(tr, Path(out) / "published-bf16.bin", rank)
        # inf in rank 1's rows only: both ranks refuse to publish, naming the parameter
        nonfinite(tr, Path(out) / f"nonfinite{rank}.txt", rank)
        if rank == 0:
            save_file(
                {k: v.contiguous() for k, v in full.items()}
                | {"metric.loss": torch.tensor([metrics["loss"], metrics["grad_norm"], metrics["tokens"]])},
                os.path.join(out, "params.safetensors"),
            )
        for ckpt, where in ((Path(out) / "ckpt", "resumed-two"), (Path(single_ckpt), "resumed-one")):
            tr = Trainer(CFG, model=model(), rank=rank, world=world)
            tr.load_checkpoint(ckpt)
            tr.train_step(batch())
            full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
            if rank == 0:
                (Path(out) / where).mkdir()
                save_file(
                    {k: v.contiguous() for k, v in full.items()},
                    os.path.join(out, where, "params.safetensors"),
                )
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()


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


def uneven_main(rank: int, world: int, port: int, out: str) -> None:
    """One step on `uneven_batch()` with the KL term on; writes how many real micro-batches this rank ran."""
    from datetime import timedelta

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import model
    from tests.trainer.test_sharded_uneven import UNEVEN_CFG, uneven_batch

    dist.init_process_group(
        "gloo",
        init_method=f"tcp://127.0.0.1:{port}",
        rank=rank,
        world_size=world,
        timeout=timedelta(seconds=60),
    )
    try:
        tr = Trainer(UNEVEN_CFG, model=model(), rank=rank, world=world)
        groups = uneven_batch()
        plan = tr.plan([t.num_tokens for g in groups for t in g])
        (Path(out) / f"micro{rank}.txt").write_text(str(sum(m is not None for _, mbs in plan for m in mbs)))
        metrics = tr.train_step(groups)
        full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
        if rank == 0:
            save_file(
                {k: v.contiguous() for k, v in full.items()}
                | {"metric.loss": torch.tensor([metrics["loss"], metrics["idle_passes"]])},
                os.path.join(out, "params.safetensors"),
            )
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()


def algorithm_main(rank: int, world: int, port: int, out: str) -> None:
    """One step of each of `test_sharded_algorithms.ALGORITHMS` on `test_sharded.batch()`, in one spawn; rank 0
    writes each one's gathered parameters and loss to `out/NAME`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from laminar.trainer.trainer import Trainer
    from tests.trainer.test_sharded import batch, model
    from tests.trainer.test_sharded_algorithms import ALGORITHMS

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        for name in sorted(ALGORITHMS):
            where = Path(out) / name
            tr = Trainer(**ALGORITHMS[name], model=model(), rank=rank, world=world)
            metrics = tr.train_step(batch())
            full = {k: v.full_tensor() for k, v in tr.model.state_dict().items()}
            losses = [metrics["loss"]]
            if tr.critic is not None:  # its gathered weights, its metrics, and a checkpoint of both ranks
                full |= {f"critic.{k}": v.full_tensor() for k, v in tr.critic.model.state_dict().items()}
                losses += [metrics["value_loss"], metrics["value_grad_norm"]]
                tr.save_checkpoint(where / "ckpt")
            if rank == 0:
                where.mkdir(exist_ok=True)
                save_file(
                    {k: v.contiguous() for k, v in full.items()} | {"metric.loss": torch.tensor(losses)},
                    str(where / "params.safetensors"),
                )
    except BaseException:
        dist.destroy_process_group()
        raise
    finish_rank()
