"""How the run makes its rollout replicas and relays: one recipe from the config, used at start and for every
replacement, so a replacement is exactly like the part it replaces (same engine, reward, sampling, relay
secret, slots and chunk size)."""

from __future__ import annotations

from typing import Any

from laminar.config import Config
from laminar.manager.manager import sampling_of
from laminar.relay.chain import relay_on_node
from laminar.relay.relay import RelaySettings
from laminar.runtime.actors import ReplicaActor


def use_cuda(cfg: Config) -> bool:
    """Asked on the driver (the manager, which places replicas, never imports torch)."""
    if cfg.model.device != "auto":
        return cfg.model.device == "cuda"
    import torch

    return torch.cuda.is_available()


def import_engine(_actor: Any) -> None:
    import laminar.engine.weights  # noqa: F401


class EngineRecipe:
    """Picklable recipe for a replica's engine, built inside the replica's process."""

    def __init__(
        self, model_path: str, cfg: Config, cuda: bool, version: int = 0, end_ids: tuple[int, ...] = ()
    ) -> None:
        self.model_path, self.cfg, self.cuda, self.version, self.end_ids = (
            model_path,
            cfg,
            cuda,
            version,
            end_ids,
        )

    def __call__(self) -> Any:
        import torch

        from laminar.engine import Engine

        r, cuda = self.cfg.rollout, self.cuda
        dtype = torch.bfloat16 if cuda or self.cfg.model.dtype == "bfloat16" else torch.float32
        return Engine.from_pretrained(
            self.model_path,
            eos_token_ids=self.end_ids,
            device="cuda" if cuda else "cpu",
            dtype=dtype,
            max_num_seqs=r.max_num_seqs,
            num_kv_blocks=r.kv_blocks,
            block_size=r.block_size,
            use_cuda_graphs=cuda,
            version=self.version,
            pipeline=None if r.pipeline == "auto" else r.pipeline == "on",
        )


class ScorerRecipe:
    def __init__(
        self,
        model_path: str,
        reward: str,
        task: str,
        timeout_s: float | None = None,
        stop_token_ids: tuple[int, ...] = (),
    ) -> None:
        self.model_path, self.reward, self.task, self.timeout_s = model_path, reward, task, timeout_s
        self.stop_token_ids = stop_token_ids

    def __call__(self) -> Any:
        from laminar.data.codec import TaskCodec
        from laminar.rewards.loader import RewardScorer
        from laminar.rewards.stop import reward_path

        codec = TaskCodec.from_dir(self.model_path, stop_token_ids=self.stop_token_ids)
        return RewardScorer(
            reward_path(self.task, self.reward),
            codec.decode,
            timeout_s=self.timeout_s,
            decode_turns=codec.response_text,
        )


class ToolRecipe:
    """Builds a replica's tool-turn driver in its own process (it holds threads): the run's tools, and the model's
    tokenizer to read calls and render the tools' output."""

    def __init__(self, model_path: str, cfg: Config) -> None:
        self.model_path, self.task = model_path, cfg.task
        self.stop_token_ids = tuple(cfg.rollout.stop_token_ids)

    def __call__(self) -> Any:
        from laminar.data.codec import TaskCodec
        from laminar.tools.registry import load_tools
        from laminar.tools.sandbox import SandboxLimits
        from laminar.tools.turns import ToolTurns

        t = self.task
        codec = TaskCodec.from_dir(self.model_path, stop_token_ids=self.stop_token_ids)
        return ToolTurns(
            tools=load_tools(t.tools),
            decode=codec.decode,
            render=codec.render_tool_output,
            limits=SandboxLimits(wall_s=t.tool_timeout_s, cpu_s=t.tool_timeout_s),
            max_turns=t.max_turns,
            max_output_tokens=t.max_tool_output_tokens,
            workers=t.tool_workers,
        )


class Factory:
    """Built by the driver once the run's parts exist, handed to the manager, which makes every replica and
    relay with it. `engine_path` and `version` are where the replicas' first weights come from (a resumed run:
    its checkpoint)."""

    def __init__(
        self,
        cfg: Config,
        model_path: str,
        relay_settings: RelaySettings,
        *,
        manager: Any,
        partial_pool: Any,
        buffer: Any,
        interrupt_on_update: bool,
        engine_path: str = "",
        version: int = 0,
        end_ids: tuple[int, ...] = (),
    ) -> None:
        self.cfg, self.model_path, self.relay_settings = cfg, model_path, relay_settings
        self.manager, self.partial_pool, self.buffer = manager, partial_pool, buffer
        self.interrupt_on_update = interrupt_on_update
        self.engine_path, self.version = engine_path or model_path, version
        self.end_ids = end_ids  # every token that ends a response: the model's, the tokenizer's, the run's
        self.cuda = use_cuda(cfg)  # decided here, on the driver

    def replica(self, rid: int) -> Any:
        cfg, r = self.cfg, self.cfg.rollout
        options = {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus if self.cuda else 0,
            **({"scheduling_strategy": "SPREAD"} if r.placement == "spread" else {}),
        }
        t = cfg.task
        return ReplicaActor.options(**options).remote(
            rid,
            EngineRecipe(self.engine_path, cfg, self.cuda, self.version, self.end_ids),
            ScorerRecipe(
                self.model_path, t.reward, t.name, t.reward_timeout_s, tuple(cfg.rollout.stop_token_ids)
            ),
            manager=self.manager,
            partial_pool=self.partial_pool,
            buffer=self.buffer,
            sampling=sampling_of(cfg),
            run_seed=cfg.run.seed,
            progress_every=r.progress_every,
            heartbeat_s=r.heartbeat_s,
            timeout_s=cfg.run.timeout_s,
            interrupt_on_update=self.interrupt_on_update,
            tools=ToolRecipe(self.model_path, cfg) if t.tools or t.tool_calls_mean > 0 else None,
        )

    def relay(self, node: str, name: str) -> Any:
        """A relay pinned to `node` with the run's secret, slots and chunk size; `ready` says when it runs."""
        return relay_on_node(node, name, self.relay_settings)

    @staticmethod
    def ready(relay: Any) -> Any:
        """Resolves once the relay is up with the engine imported (layouts are engine objects)."""
        return relay.__ray_call__.remote(import_engine)
