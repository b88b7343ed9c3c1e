"""The trainer's checkpoints: a whole HF model directory plus the optimizer's moments, the step, optimizer
groups and RNG, with no pickle anywhere (`laminar.trainer.state_files`); any checkpoint resumes onto any number of
ranks."""

from __future__ import annotations

import random
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from laminar.data.codec import copy_tokenizer_files
from laminar.engine.model_dir import check_model_dir
from laminar.trainer import lora
from laminar.trainer.critic import DIR as CRITIC_DIR
from laminar.trainer.state_files import (
    MOMENTS,
    OPTIMIZER_DIR,
    CheckpointError,
    load_tensors,
    load_trainer_state,
    save_sharded,
    save_tensors,
    save_trainer_state,
)


class Checkpointing:
    """`Trainer`'s checkpoints (reads `model`, `optimizer`, `critic`, `master`, `lora`, `rank`, `world`, `cfg`,
    `model_path` and `version`)."""

    def save_checkpoint(self, out: str | Path) -> Path:
        """`out` becomes a whole HF model dir (config, safetensors, and the tokenizer, chat template and
        generation config of the model it started from) plus the optimizer's moments in `optimizer/`, and the
        step, optimizer groups and RNG, with no pickle anywhere (see `state_files`). A sharded trainer writes
        with `torch.distributed.checkpoint`: each rank its own rows, then rank 0 joins the files into the same
        layout (every rank must call this). Any checkpoint resumes onto any number of ranks."""
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        moments, steps = self._moments()
        if self.lora:  # the merged model (a resume's replicas and `laminar export` load it) and the adapters
            merged = lora.merged_weights(self.model, self.publish_names())
            save_file(
                {k: v.detach().cpu().contiguous() for k, v in merged.items()},
                str(out / "model.safetensors"),
                metadata={"format": "pt"},
            )
            self.model.config.save_pretrained(out)
            if self.model.generation_config is not None:
                self.model.generation_config.save_pretrained(out)
            lora.save_adapter(self.model, out / lora.ADAPTER_DIR)
            save_tensors(moments, out / OPTIMIZER_DIR)
        elif self.world == 1:
            self.model.save_pretrained(out)
            save_tensors(moments, out / OPTIMIZER_DIR)
        else:
            save_sharded(self._model_tensors(), out, whole=True)
            save_sharded(moments, out / OPTIMIZER_DIR, whole=False)
        if self.critic is not None:
            self.critic.save(out / CRITIC_DIR, self.rank)
        if self.rank == 0:
            if self.world > 1:
                self.model.config.save_pretrained(out)
                if self.model.generation_config is not None:
                    self.model.generation_config.save_pretrained(out)
            if self.model_path:
                copy_tokenizer_files(self.model_path, out)
            groups = self.optimizer.state_dict()["param_groups"]
            meta = {"version": self.version, "ranks": self.world, "config": asdict(self.cfg)}
            rng = {
                "torch": torch.get_rng_state(),
                "python": random.getstate(),
                "numpy": np.random.get_state(),
            }
            save_trainer_state(out, groups, steps, rng, meta)
        if self.world > 1:
            import torch.distributed as dist

            dist.barrier()
        return out

    def load_checkpoint(self, path: str | Path) -> None:
        """Restore what `save_checkpoint` wrote, whatever number of ranks wrote it (`torch.distributed.checkpoint`
        reads each rank's rows from the files)."""
        path = check_model_dir(path)
        groups, steps, rng, meta = load_trainer_state(path)
        trained = self._trained()
        names = [n for n, _ in trained]
        if sorted(steps) != sorted(names):
            raise CheckpointError(
                f"{path / 'trainer_state.json'}: optimizer steps for {len(steps)} parameters, but the model has "
                f"{len(names)} (first difference: {sorted(set(steps) ^ set(names))[:1]}); another model's checkpoint?"
            )
        moments = {f"{kind}.{n}": torch.zeros_like(p) for n, p in trained for kind in MOMENTS}
        try:
            if self.lora:  # the base is `model_path`'s, frozen: only the adapters were trained
                adapters = {lora.adapter_key(n): p.detach() for n, p in trained}
                load_tensors(adapters, path / lora.ADAPTER_DIR, 1)
            else:
                load_tensors(self._model_tensors(), path, self.world)
            load_tensors(moments, path / OPTIMIZER_DIR, self.world)
        except Exception as e:  # noqa: BLE001 - any reader failure is a bad checkpoint, named
            raise CheckpointError(f"{path}: the weights or optimizer moments do not load ({e})") from e
        state = {
            i: {"step": torch.tensor(float(steps[n]))} | {k: moments[f"{k}.{n}"] for k in MOMENTS}
            for i, n in enumerate(names)
        }
        self.optimizer.load_state_dict({"state": state, "param_groups": groups})
        if self.critic is not None:
            self.critic.load(path / CRITIC_DIR)
        if self.master is not None:
            self.master.refresh()
        self.version = int(meta["version"])
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
        np.random.set_state(rng["numpy"])

    def _model_tensors(self) -> dict[str, torch.Tensor]:
        """The parameters by their HF names (a tied head once), as live tensors: DCP reads and writes them."""
        sd = self.model.state_dict()
        return {k: sd[k] for k in self.publish_names()}

    def _moments(self) -> tuple[dict[str, torch.Tensor], dict[str, int]]:
        """AdamW's moments by `exp_avg.NAME` / `exp_avg_sq.NAME`, and each parameter's step count. A parameter
        with no update yet gets zero moments, which is what AdamW starts from."""
        tensors, steps = {}, {}
        for n, p in self._trained():
            st = self.optimizer.state.get(p, {})
            steps[n] = int(st["step"]) if "step" in st else 0
            for kind in MOMENTS:
                tensors[f"{kind}.{n}"] = st[kind] if kind in st else torch.zeros_like(p)
        return tensors, steps
