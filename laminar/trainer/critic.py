"""PPO's learned critic (`trainer.advantage=gae`): a value model trained beside the policy.

The critic is the policy's decoder (a copy of the starting weights) with a scalar head, zero at the start, so the
first advantages are the rewards less nothing. It reads the same batches as the policy (`Trainer._collate`): the
value of each response token is read at the position whose prediction is that token, i.e. V(s_t) of the state
the token is emitted from. It has its own AdamW (`trainer.critic_lr`) stepping with the policy's, and its own
folder in a checkpoint (`critic/`: its weights, moments and step count, in safetensors and JSON). A sharded
trainer shards it as it shards the policy (FSDP2, each decoder layer a unit): every rank holds its rows, scores
its own share of the batch, and a checkpoint written by any number of ranks resumes on any number.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from laminar.trainer.sharding import clip_grad_norm, shard
from laminar.trainer.state_files import CheckpointError, load_tensors, save_sharded, save_tensors

DIR = "critic"  # the critic's folder inside a trainer checkpoint
MOMENTS = ("exp_avg", "exp_avg_sq")


class ValueModel(nn.Module):
    """A causal LM's decoder and a linear head to one value a position."""

    def __init__(self, causal_lm: nn.Module) -> None:
        super().__init__()
        self.decoder = copy.deepcopy(causal_lm.get_decoder())
        hidden = int(causal_lm.config.get_text_config().hidden_size)
        self.head = nn.Linear(hidden, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, ids: torch.Tensor, attn: torch.Tensor | None, positions: torch.Tensor, **packed: Any):
        """The values at the flat `positions` of the [B, L] (or packed [1, T]) batch, as float32."""
        hidden = self.decoder(input_ids=ids, attention_mask=attn, use_cache=False, **packed).last_hidden_state
        hidden = hidden.flatten(0, 1).index_select(0, positions)
        return self.head(hidden).squeeze(-1).float()


class Critic:
    """The value model, its optimizer and its checkpoint folder. `causal_lm`: the policy as loaded (before any
    adapters), whose decoder it copies; `device`: the trainer's; `world` > 1: sharded over the trainer's ranks
    (`cpu_offload` as the policy's)."""

    def __init__(
        self,
        causal_lm: nn.Module,
        lr: float,
        weight_decay: float,
        max_grad_norm: float,
        device,
        world: int = 1,
        cpu_offload: bool = False,
    ) -> None:
        self.device = torch.device(device)
        self.world = world
        self.model = ValueModel(causal_lm).float().train()
        if world > 1:  # before the optimizer: sharding replaces the parameters with DTensors
            shard(self.model, self.model.decoder, self.device, cpu_offload)
        else:
            self.model.to(self.device)
        self.max_grad_norm = max_grad_norm
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=lr, weight_decay=weight_decay, fused=self.device.type == "cuda"
        )

    def values(self, batch: dict[str, Any]) -> torch.Tensor:
        """The batch's values (with gradient); bf16 autocast on CUDA, as the policy's forward."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.device.type == "cuda"):
            return self.model(batch["ids"], batch["attn"], batch["positions"], **batch.get("packed", {}))

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> float:
        """Clip the gradient (`trainer.max_grad_norm`, as the policy's) and update; returns the norm before."""
        norm = clip_grad_norm(self.model.parameters(), self.max_grad_norm)
        self.optimizer.step()
        return norm

    # ---- checkpoints --------------------------------------------------------------------------------------
    def save(self, out: Path, rank: int = 0) -> None:
        """`out/weights/`, `out/optimizer/` (safetensors) and `out/state.json` (each parameter's step count).
        Sharded: every rank calls this and writes its rows (the weights joined into whole tensors, as the
        policy's); rank 0 writes the step counts."""
        tensors, steps = self._moments()
        weights = {n: p.detach() for n, p in self.model.named_parameters()}
        if self.world > 1:
            save_sharded(weights, out / "weights", whole=True)
            save_sharded(tensors, out / "optimizer", whole=False)
        else:
            save_tensors(weights, out / "weights")
            save_tensors(tensors, out / "optimizer")
        if rank == 0:
            (out / "state.json").write_text(json.dumps({"steps": steps}, indent=1))

    def load(self, path: Path) -> None:
        """Restore what `save` wrote, or raise `CheckpointError` naming what is missing or wrong."""
        state = path / "state.json"
        if not state.is_file():
            raise CheckpointError(
                f"{path}: no critic in this checkpoint (expected {DIR}/state.json, weights/ and optimizer/); a run "
                "with trainer.advantage=gae resumes only from a checkpoint of a gae run"
            )
        try:
            steps = json.loads(state.read_text())["steps"]
            params = dict(self.model.named_parameters())
            if sorted(steps) != sorted(params):
                raise ValueError(f"step counts for {len(steps)} parameters, the critic has {len(params)}")
            moments = {f"{k}.{n}": torch.zeros_like(p) for n, p in params.items() for k in MOMENTS}
            with torch.no_grad():
                load_tensors({n: p.detach() for n, p in params.items()}, path / "weights", self.world)
            load_tensors(moments, path / "optimizer", self.world)
        except CheckpointError:
            raise
        except Exception as e:  # noqa: BLE001 - any reader failure is a bad checkpoint, named
            raise CheckpointError(f"{path}: the critic's weights or moments do not load ({e})") from e
        groups = self.optimizer.state_dict()["param_groups"]
        state_of = {
            i: {"step": torch.tensor(float(steps[n]))} | {k: moments[f"{k}.{n}"] for k in MOMENTS}
            for i, n in enumerate(params)
        }
        self.optimizer.load_state_dict({"state": state_of, "param_groups": groups})

    def _moments(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        tensors, steps = {}, {}
        for n, p in self.model.named_parameters():
            st = self.optimizer.state.get(p, {})
            steps[n] = int(st["step"]) if "step" in st else 0
            for kind in MOMENTS:
                tensors[f"{kind}.{n}"] = st[kind] if kind in st else torch.zeros_like(p)
        return tensors, steps
