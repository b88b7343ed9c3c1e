"""What the trainer publishes: the HF-named weights of a single trainer, or each rank's rows of them, cast to
`publish_dtype`, with one non-finite flag for all of it (the relay's publisher copies them out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

from laminar.trainer import lora


def _ties_embeddings(model: PreTrainedModel) -> bool:
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    return bool(getattr(cfg, "tie_word_embeddings", False))


class Publishing:
    """`Trainer`'s side of a publish (reads `cfg`, `model`, `master`, `lora`, `publish_dtype`, `rank` and `world`)."""

    def publish_names(self) -> list[str]:
        """The published tensors' names, the keys `save_pretrained` writes: with tied embeddings
        `lm_head.weight` is left out (it is `model.embed_tokens.weight`) and loaders re-tie it."""
        if self._names is None:
            names = [lora.base_name(k) for k in self.model.state_dict()]
            self._names = [k for k in names if k is not None]  # LoRA: the base model's names, no adapter
            if _ties_embeddings(self.model):
                self._names.remove("lm_head.weight")
        return list(self._names)

    def _wire_dtype(self) -> torch.dtype | None:
        """The dtype weights are published in (`publish_dtype`), or None: each tensor's own."""
        return getattr(torch, self.publish_dtype) if self.publish_dtype else None

    def publish_specs(self) -> list[tuple[str, tuple[int, ...], torch.dtype]] | None:
        """(name, shape, dtype) of every tensor a publish writes, the whole tensor's shape on a sharded trainer,
        without copying any (a publisher makes its slots from them before the first publish); None where they
        are known only once built (LoRA)."""
        if self.lora:
            return None
        sd = self.model.state_dict()
        dtype = self._wire_dtype()
        return [(k, tuple(sd[k].shape), dtype or sd[k].dtype) for k in self.publish_names()]

    def named_weights(self, check: bool = True) -> dict[str, torch.Tensor]:
        """The HF state_dict to publish (`publish_names`), or with `trainer.lora_publish=adapters` the LoRA
        adapters alone (`lora.adapter_weights`). The tensors are live views, valid until the next
        `train_step`; copy them out before training on. On CUDA they stay on the GPU (the publisher copies them
        into its registered shared-memory slot); with `publish_dtype` they are cast copies, e.g. bf16 for a bf16
        engine, which halves the bytes on the weight path. Non-finite weights raise `NonFiniteError` instead
        (`check=False`: the caller checks, see `publish_parts`). A sharded trainer has no whole tensors: see
        `weight_shards`."""
        if self.world > 1:
            raise RuntimeError("a sharded trainer publishes its shards (weight_shards), never whole weights")
        if check:
            self.check_finite()
        dtype = self._wire_dtype()
        if self.cfg.publishes_adapters:  # the replicas add them to their base
            return lora.adapter_weights(self.model, self._merged, dtype)
        if self.lora:
            return lora.merged_weights(self.model, self.publish_names(), self._merged, dtype)
        if self.master is not None and dtype == self.master.dtype:  # the compute copy is already that cast
            if self._compute_views is None:  # refreshed in place after every update: resolved once
                sd = self.master.compute.state_dict()
                self._compute_views = {k: sd[k].detach() for k in self.publish_names()}
            return dict(self._compute_views)
        sd = self.model.state_dict()
        return {k: sd[k].detach().to(dtype) if dtype else sd[k].detach() for k in self.publish_names()}

    def weight_shards(self, check: bool = True) -> list[WeightShard]:
        """This rank's rows of every published tensor (FSDP shards dim 0 in contiguous row blocks), cast to
        `publish_dtype`: each rank writes them at their offsets into the one flat buffer of the version.
        The cast rows lie back to back in one buffer, kept between publishes and written by one multi-tensor
        copy (a cast a tensor cost a launch and an allocation each); the returned rows are views of it, valid
        until the next call. `check=False`: the caller checks them (`publish_parts`)."""
        if check:
            self.check_finite()
        views = self._shards()
        self._cast = None
        dtype = self._wire_dtype() or views[0].dtype
        if dtype == views[0].dtype:
            return list(views)  # published as they are
        if self._cast_rows is None or self._cast_rows[0].dtype != dtype:
            # kept between publishes: a fresh allocation of the whole shard each time can make the caching
            # allocator free its cached blocks first, with a device-wide sync (tens to hundreds of ms)
            flat = torch.empty(sum(v.local.numel() for v in views), dtype=dtype, device=views[0].local.device)
            parts = torch.split(flat, [v.local.numel() for v in views])
            self._cast_rows = (flat, [p.view(v.local.shape) for p, v in zip(parts, views)])
        flat, cast = self._cast_rows
        with torch.no_grad():
            torch._foreach_copy_(cast, [v.local for v in views])
        self._cast = flat
        return [WeightShard(v.name, v.shape, dtype, v.first_row, c) for v, c in zip(views, cast)]

    def publish_parts(self) -> tuple[Any, torch.Tensor]:
        """What a publish copies out, and one flag for all of it queued on the device (1: NaN or inf): a single
        trainer's whole tensors (`named_weights`), a sharded one's rows (`weight_shards`). After the copy,
        `raise_nonfinite(flag, summary=True)` judges them, on every rank alike."""
        if self.world > 1:
            shards = self.weight_shards(check=False)
            return shards, self.published_nonfinite()
        flag = self.nonfinite_flags().max().view(1)
        return self.named_weights(check=False), flag

    @torch.no_grad()
    def published_nonfinite(self) -> torch.Tensor:
        """One flag for all the rows the last `weight_shards` cast, 1 if any is NaN or inf: a single reduction
        over the bytes that are published (`raise_nonfinite(..., summary=True)` names the parameters only when
        it is set). Without a cast, the same from the per-parameter `nonfinite_flags`."""
        if self._cast is None:
            return self.nonfinite_flags().max().view(1)
        if not self._cast.numel():
            return torch.zeros(1, dtype=torch.int32, device=self._cast.device)
        return (~torch.isfinite(torch.stack(torch.aminmax(self._cast)).float()).all()).int().view(1)

    def _shards(self) -> list[WeightShard]:
        """This rank's rows of every published tensor as they are (live, in the master dtype), resolved once:
        a model's state_dict costs milliseconds a call for a sharded model (a DTensor detach a tensor)."""
        if self._shard_views is None:
            sd = self.model.state_dict()
            self._shard_views = [
                WeightShard(
                    name,
                    tuple(sd[name].shape),
                    sd[name].dtype,
                    _first_row(sd[name], self.rank, self.world),
                    local_rows(sd[name]).detach(),
                )
                for name in self.publish_names()
            ]
        return self._shard_views


@dataclass
class WeightShard:
    """Rows [first_row, first_row + len(local)) of the published tensor `name` of `shape`, held by one rank."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    first_row: int
    local: torch.Tensor


def local_rows(p: torch.Tensor) -> torch.Tensor:
    """A sharded (DTensor) parameter's own rows (the same storage, no autograd); a plain tensor itself."""
    if hasattr(p, "to_local"):
        with torch.no_grad():
            return p.to_local()
    return p


def _first_row(p: torch.Tensor, rank: int, world: int) -> int:
    """FSDP's dim-0 sharding: rank r holds rows [r c, (r + 1) c) of n, c = ceil(n / world), cut at n."""
    if world == 1 or not hasattr(p, "to_local"):
        return 0
    n = p.shape[0]
    return min(rank * -(-n // world), n)
