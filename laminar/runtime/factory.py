"""How the run makes its rollout replicas and relays: one recipe from the config, used at start and for every
replacement, so a replacement is exactly like the part it replaces (same engine, reward, sampling, relay
secret, slots and chunk size).

Every replica and relay is named in the run's Ray namespace and outlives the process that made it (a detached
actor): the manager that makes them may be lost and restarted, and finds them again by name (`find`). The driver
ends them all with the run (`sweep`), and a resumed run first ends what its stopped segment left there."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import os
import socket
from pathlib import Path
from typing import TYPE_CHECKING, Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from laminar.config import Config, TaskConfig
from laminar.engine.config import Speculation
from laminar.manager.spec import sampling_of
from laminar.relay.chain import relay_on_node
from laminar.relay.relay import RelaySettings
from laminar.rewards.stop import reward_path
from laminar.runtime.actors import RankActor, ReplicaActor

if TYPE_CHECKING:
    from laminar.data.codec import PlainDecoder, PlainToolRenderer


def use_cuda(cfg: Config) -> bool:
    """Asked on the driver (the manager, which places replicas, never imports torch)."""
    if cfg.model.device != "auto":
        return cfg.model.device == "cuda"
    import torch

    return torch.cuda.is_available()


BUFFER = "buffer"  # the experience buffer's name in the run's namespace (the manager looks it up)


def run_namespace(run_dir: Path) -> str:
    """The Ray namespace of a run folder's actors: the same for every segment of the run."""
    return "laminar-" + hashlib.sha1(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def group_name(namespace: str, replica: str) -> str:
    """The placement group of a tensor-parallel replica's ranks (placement groups are named across namespaces)."""
    return f"{namespace}/{replica}"


def remove_groups(namespace: str, keep: set[str] = frozenset(), only: str | None = None) -> list[str]:
    """Remove the tensor-parallel replicas' placement groups of `namespace` whose replica is not in `keep` (or only
    `only`'s): their ranks end with them."""
    gone = []
    for pg_id, info in ray.util.placement_group_table().items():
        namespace_of, _, replica = info.get("name", "").partition("/")
        if namespace_of != namespace or replica in keep or info.get("state") == "REMOVED":
            continue
        if only is not None and replica != only:
            continue
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_id))))
        gone.append(replica)
    return gone


def sweep(namespace: str, keep: set[str] = frozenset()) -> list[str]:
    """End every replica and relay named in `namespace` but not in `keep`; returns their names."""
    gone = remove_groups(namespace, keep)
    for actor in ray.util.list_named_actors(all_namespaces=True):
        name = actor["name"]
        if actor["namespace"] != namespace or name in keep or not name.startswith(("replica-", "relay-")):
            continue
        try:
            ray.kill(ray.get_actor(name, namespace=namespace))
        except ValueError:  # ended meanwhile
            continue
        gone.append(name)
    return gone


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """A replica's engine settings as `Engine` takes them (`laminar.engine.Engine`), from the `rollout` section."""

    cuda: bool  # on the driver's answer (`use_cuda`): CUDA graphs and bf16 there
    bf16: bool  # the weights' dtype: bf16 on CUDA or with model.dtype=bfloat16, else fp32
    max_num_seqs: int
    num_kv_blocks: int
    block_size: int
    pipeline: bool | None  # None: the engine's choice (on where decode runs as CUDA graphs)
    speculation: Speculation

    @classmethod
    def of(cls, cfg: Config, cuda: bool) -> EngineSpec:
        r = cfg.rollout
        return cls(
            cuda,
            cuda or cfg.model.dtype == "bfloat16",
            r.max_num_seqs,
            r.kv_blocks,
            r.block_size,
            None if r.pipeline == "auto" else r.pipeline == "on",
            Speculation(
                r.speculation,
                r.speculation_max_draft,
                r.speculation_max_batch,
                r.speculation_min_acceptance,
                r.speculation_cost_ratio,
            ),
        )


class EngineRecipe:
    """Picklable recipe for a replica's engine, built inside the replica's process: the weights of `model_path`,
    plus, with `adapter_path`, a peft adapter directory's LoRA adapters added to them (a resumed run whose
    publishes are adapters: the replicas keep the base and add each version to it)."""

    def __init__(
        self,
        model_path: str,
        spec: EngineSpec,
        version: int = 0,
        end_ids: tuple[int, ...] = (),
        adapter_path: str = "",
    ) -> None:
        self.model_path, self.spec, self.version, self.end_ids = model_path, spec, version, end_ids
        self.adapter_path = adapter_path

    @property
    def cuda(self) -> bool:
        return self.spec.cuda

    def __call__(self, tensor_parallel: Any = None) -> Any:
        """The engine; `tensor_parallel`: this process's `TPGroup` among a replica's ranks (None: the only one)."""
        import torch

        from laminar.engine import Engine

        e = self.spec
        engine = Engine.from_pretrained(
            self.model_path,
            eos_token_ids=self.end_ids,
            device="cuda" if e.cuda else "cpu",
            dtype=torch.bfloat16 if e.bf16 else torch.float32,
            max_num_seqs=e.max_num_seqs,
            num_kv_blocks=e.num_kv_blocks,
            block_size=e.block_size,
            use_cuda_graphs=e.cuda,
            version=self.version,
            pipeline=e.pipeline,
            speculation=e.speculation,
            tensor_parallel=tensor_parallel,
        )
        if self.adapter_path:
            from laminar.engine.adapters import read_peft_adapter

            engine.load_state_dict(read_peft_adapter(self.adapter_path), self.version)
        return engine


class GroupRecipe:
    """Rank 0's engine of a tensor-parallel replica, built in rank 0's process: it makes the other ranks (its own
    actors, in the bundles of its placement group after its own), joins them and returns a `Leader`
    (`laminar.rollout.tensor_parallel`) that its replica holds as its engine."""

    def __init__(
        self, engine: EngineRecipe, pg: Any, world: int, num_cpus: float, timeout_s: float, idle_s: float
    ):
        self.engine, self.pg, self.world, self.num_cpus = engine, pg, world, num_cpus
        self.timeout_s, self.idle_s = timeout_s, idle_s

    def __call__(self) -> Any:
        import torch

        from laminar.relay.pull import SlotReader
        from laminar.rollout.tensor_parallel import Leader, join_group

        cuda = self.engine.cuda
        ranks = [
            RankActor.options(
                num_cpus=self.num_cpus,
                num_gpus=1 if cuda else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=r),
            ).remote(r, self.world, self.engine, cuda, self.timeout_s, self.idle_s)
            for r in range(1, self.world)
        ]
        with socket.socket() as s:  # where rank 0 listens for the others
            s.bind(("", 0))
            address = (ray.util.get_node_ip_address(), s.getsockname()[1])
        for rank in ranks:
            rank.run.remote(address, torch.get_num_threads())
        if cuda:
            torch.cuda.set_device(0)
        tp, channel = join_group(0, self.world, address, cuda, self.timeout_s, self.idle_s)
        engine = self.engine(tp)
        pids = ray.get([rank.pid.remote() for rank in ranks], timeout=self.timeout_s)
        reader = SlotReader(None, timeout=self.timeout_s)
        return Leader(engine, channel, reader, [os.getpid(), *pids], tuple(ranks))


class ScorerRecipe:
    """The replica's scorer, for the reward the driver chose (`laminar.rewards.stop.choose_reward`). It reads
    responses through `decoder` (`TaskCodec.plain_decoder`, made on the driver) where the tokenizer has one,
    without transformers in the replica; else through the tokenizer loaded from the model directory."""

    def __init__(
        self,
        model_path: str,
        reward: str,
        timeout_s: float | None,
        stop_token_ids: tuple[int, ...],
        processes: int,
        tokenizer_class: str,
        decoder: PlainDecoder | None = None,
    ) -> None:
        self.model_path, self.reward, self.timeout_s = model_path, reward, timeout_s
        self.stop_token_ids, self.processes = stop_token_ids, processes
        self.tokenizer_class = tokenizer_class  # the driver's AutoTokenizer chose it (`TaskCodec.from_dir`)
        self.decoder = decoder

    def __call__(self) -> Any:
        from laminar.data.codec import TaskCodec
        from laminar.rewards.loader import RewardScorer

        if self.decoder is not None:
            responses = self.decoder.build()
        else:
            responses = TaskCodec.from_dir(
                self.model_path, stop_token_ids=self.stop_token_ids, tokenizer_class=self.tokenizer_class
            ).responses
        return RewardScorer(
            self.reward,
            responses.decode,
            timeout_s=self.timeout_s,
            decode_turns=responses.response_text,
            processes=self.processes,
        )


class ToolRecipe:
    """Builds a replica's tool-turn driver in its own process (it holds threads): the run's tools, and the model's
    tokenizer to read calls and render the tools' output: `decoder` and `renderer` (`TaskCodec.plain_decoder`,
    `TaskCodec.plain_tool_renderer`, made on the driver) where the tokenizer has both, without transformers in the
    replica; else the tokenizer loaded from the model directory."""

    def __init__(
        self,
        model_path: str,
        task: TaskConfig,
        stop_token_ids: tuple[int, ...],
        tokenizer_class: str,
        decoder: PlainDecoder | None = None,
        renderer: PlainToolRenderer | None = None,
    ) -> None:
        self.model_path, self.task, self.tokenizer_class = model_path, task, tokenizer_class
        self.stop_token_ids = stop_token_ids
        self.decoder, self.renderer = decoder, renderer

    def __call__(self) -> Any:
        from laminar.data.codec import TaskCodec
        from laminar.tools.registry import load_tools
        from laminar.tools.sandbox import SandboxLimits
        from laminar.tools.turns import ToolTurns

        t = self.task
        if self.decoder is not None and self.renderer is not None:
            decode, render = self.decoder.build().decode, self.renderer
        else:
            codec = TaskCodec.from_dir(
                self.model_path, stop_token_ids=self.stop_token_ids, tokenizer_class=self.tokenizer_class
            )
            decode, render = codec.decode, codec.render_tool_output
        return ToolTurns(
            tools=load_tools(t.tools),
            decode=decode,
            render=render,
            limits=SandboxLimits(wall_s=t.tool_timeout_s, cpu_s=t.tool_timeout_s),
            max_turns=t.max_turns,
            max_output_tokens=t.max_tool_output_tokens,
            workers=t.tool_workers,
        )


@dataclasses.dataclass(frozen=True)
class ReplicaSpec:
    """How the run's replicas are made, from its config once on the driver (`of`): the manager's factory makes
    every replica and replacement from this, never from the `Config`."""

    engine: EngineSpec
    reward: str  # the reward the driver chose (`laminar.rewards.stop.reward_path`)
    num_cpus: float
    num_gpus: float  # a replica's share of a GPU (a rank's with tensor parallelism), 0 without CUDA
    spread: bool  # rollout.placement=spread: across machines
    tensor_parallel: int
    start_timeout_s: float
    timeout_s: float  # run.timeout_s
    progress_every: int
    heartbeat_s: float
    sampling: dict[str, Any]  # `laminar.manager.spec.sampling_of`
    run_seed: int
    reward_timeout_s: float | None
    reward_processes: int
    stop_token_ids: tuple[int, ...]
    tools: TaskConfig | None  # the task's tool settings when replicas run tool turns, else None

    @classmethod
    def of(cls, cfg: Config) -> ReplicaSpec:
        r, t, cuda = cfg.rollout, cfg.task, use_cuda(cfg)
        return cls(
            engine=EngineSpec.of(cfg, cuda),
            reward=reward_path(cfg),
            num_cpus=r.num_cpus,
            num_gpus=r.num_gpus if cuda else 0,
            spread=r.placement == "spread",
            tensor_parallel=r.tensor_parallel,
            start_timeout_s=r.start_timeout_s,
            timeout_s=cfg.run.timeout_s,
            progress_every=r.progress_every,
            heartbeat_s=r.heartbeat_s,
            sampling=sampling_of(cfg),
            run_seed=cfg.run.seed,
            reward_timeout_s=t.reward_timeout_s,
            reward_processes=t.reward_processes,
            stop_token_ids=tuple(r.stop_token_ids),
            tools=t if t.tools or t.tool_calls_mean > 0 else None,
        )


class Factory:
    """Built by the driver and handed to the manager, which makes every replica and relay with it (bound to
    itself and the buffer: `for_manager`). `engine_path`, `adapter_path` and `version` are where the replicas'
    first weights come from (a resumed run: its checkpoint, `checkpoint.replica_weights`); `namespace` is the
    run's."""

    def __init__(
        self,
        spec: ReplicaSpec,
        model_path: str,
        relay_settings: RelaySettings,
        *,
        partial_pool: Any,
        interrupt_on_update: bool,
        namespace: str,
        manager: Any = None,
        buffer: Any = None,
        engine_path: str = "",
        adapter_path: str = "",
        version: int = 0,
        end_ids: tuple[int, ...] = (),
        tokenizer_class: str = "",
        decoder: PlainDecoder | None = None,
        tool_renderer: PlainToolRenderer | None = None,
    ) -> None:
        self.spec, self.model_path, self.relay_settings = spec, model_path, relay_settings
        self.namespace = namespace
        self.manager, self.partial_pool, self.buffer = manager, partial_pool, buffer
        self.interrupt_on_update = interrupt_on_update
        self.engine_path, self.version = engine_path or model_path, version
        self.adapter_path = adapter_path
        self.end_ids = end_ids  # every token that ends a response: the model's, the tokenizer's, the run's
        self.tokenizer_class = (
            tokenizer_class  # the class the driver's AutoTokenizer chose ("" = choose again)
        )
        self.decoder = decoder  # the scorers' and the tool drivers' (`ScorerRecipe`, `ToolRecipe`)
        self.tool_renderer = tool_renderer  # the tool drivers'

    def for_manager(self, manager: Any) -> Factory:
        """This factory for the manager `manager`: its replicas talk to it, the partial pool and the buffer."""
        bound = copy.copy(self)
        bound.manager, bound.buffer = manager, self.find(BUFFER)
        return bound

    @staticmethod
    def replica_name(rid: int) -> str:
        return f"replica-{rid}"

    def find(self, name: str) -> Any:
        """An actor of the run by name, or None if there is none (it died, or was never made)."""
        try:
            return ray.get_actor(name, namespace=self.namespace)
        except ValueError:
            return None

    def sweep(self, keep: set[str]) -> list[str]:
        """End the run's replicas and relays that are not in `keep` (made by a manager lost before it recorded
        them)."""
        return sweep(self.namespace, keep)

    def replica(self, rid: int) -> Any:
        """Replica `rid`'s actor (rank 0 of its ranks with `rollout.tensor_parallel`: the ranks are one placement
        group, STRICT_PACK, on one machine; rank 0 in its first bundle makes the others in the rest)."""
        spec = self.spec
        options = {
            "name": self.replica_name(rid),
            "namespace": self.namespace,
            "lifetime": "detached",  # outlives the manager that made it (it may be restarted)
            "num_cpus": spec.num_cpus,
            "num_gpus": spec.num_gpus,
            **({"scheduling_strategy": "SPREAD"} if spec.spread else {}),
        }
        engine = EngineRecipe(self.engine_path, spec.engine, self.version, self.end_ids, self.adapter_path)
        if spec.tensor_parallel > 1:
            gpus = 1 if spec.engine.cuda else 0
            pg = placement_group(
                [{"CPU": spec.num_cpus, **({"GPU": gpus} if gpus else {})}] * spec.tensor_parallel,
                strategy="STRICT_PACK",
                name=group_name(self.namespace, self.replica_name(rid)),
                lifetime="detached",
            )
            options["num_gpus"] = gpus
            options["scheduling_strategy"] = PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=0
            )
            wait = spec.timeout_s
            # a following rank waits `idle` for rank 0's next call: rank 0 asks the manager for work within
            # run.timeout_s, and before its first call it waits for its start
            idle = 3 * wait + spec.start_timeout_s
            engine = GroupRecipe(engine, pg, spec.tensor_parallel, spec.num_cpus, wait, idle)
        return ReplicaActor.options(**options).remote(
            rid,
            engine,
            ScorerRecipe(
                self.model_path,
                spec.reward,
                spec.reward_timeout_s,
                spec.stop_token_ids,
                spec.reward_processes,
                self.tokenizer_class,
                self.decoder,
            ),
            manager=self.manager,
            partial_pool=self.partial_pool,
            buffer=self.buffer,
            sampling=spec.sampling,
            run_seed=spec.run_seed,
            progress_every=spec.progress_every,
            heartbeat_s=spec.heartbeat_s,
            timeout_s=spec.timeout_s,
            interrupt_on_update=self.interrupt_on_update,
            tools=ToolRecipe(
                self.model_path,
                spec.tools,
                spec.stop_token_ids,
                self.tokenizer_class,
                self.decoder,
                self.tool_renderer,
            )
            if spec.tools is not None
            else None,
        )

    def end_replica(self, rid: int, handle: Any) -> None:
        """End a replica (a hung one too) and, with tensor parallelism, its placement group and every rank in it."""
        if handle is not None:
            ray.kill(handle)
        if self.spec.tensor_parallel > 1:
            remove_groups(self.namespace, only=self.replica_name(rid))

    def relay(self, node: str, name: str) -> Any:
        """A relay pinned to `node` with the run's secret, slots and chunk size; `ready` says when it runs."""
        return relay_on_node(node, name, self.relay_settings, namespace=self.namespace)

    @staticmethod
    def ready(relay: Any) -> Any:
        """Resolves once the relay is up. A relay never loads torch: the layout it reads is plain Python
        (`laminar.engine.layout`)."""
        return relay.ping.remote()
