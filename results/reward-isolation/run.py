"""Does a reward stuck in C stop generation? An engine decodes on CPU in one thread while the trajectories it
finishes are scored on a `ScoringPool`, wired as `laminar.rollout.replica` wires them (`SCORE_WORKERS` threads,
a `RewardScorer` with a timeout). One trajectory answers `\\boxed{9^{9^{9}}}` to a row whose ground truth is
`\\sqrt{2}`: math-verify then computes 9**387420489, one C call that holds the GIL. Written to the JSON:
generated tokens/s before, during and after that call (which the timeout ends), the longest stall of a thread
that wakes every 10 ms (the replica's heartbeat and store threads are such threads), the ordinary rewards scored
meanwhile, and what a scorer's worker processes cost to start, here and inside a Ray actor (a replica).

    .venv/bin/python results/reward-isolation/run.py

`--loader FILE` scores with another copy of `laminar/rewards/loader.py` (e.g. the one before rewards ran in
processes, which runs them on threads of this process); use it with `--reward bignum` (9**(2*10**7), some 20 s
of C), as the power tower would hold that process for good."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOWER = r"So the answer is \boxed{9^{9^{9}}}"
TOWER_ROW = {"ground_truth": r"\sqrt{2}", "data_source": "lighteval/MATH", "row": "tower"}
BAD_IDS = [-1]  # the response that decodes to TOWER
ROW = {"ground_truth": "12"}  # the ordinary rows: `arith`'s, a numeric truth, read by the generic math reward
BIGNUM_EXPONENT = 2 * 10**7


def math_or_bignum(text: str, row: dict[str, Any]) -> float:
    """The math reward, except on the row marked `bignum`: a big-integer power, one C call holding the GIL."""
    if row.get("bignum"):
        pow(9, BIGNUM_EXPONENT)
    from laminar.rewards.math import default_score

    return default_score(text, row)


class Ticker:
    """Wakes every 10 ms and keeps the times: a gap is a stretch where no thread of this process could run."""

    def __init__(self) -> None:
        self.ticks: list[float] = []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.wait(0.01):
            self.ticks.append(time.monotonic())

    def max_gap(self, t0: float, t1: float) -> float:
        inside = [t0] + [t for t in self.ticks if t0 <= t <= t1] + [t1]
        return max(b - a for a, b in zip(inside, inside[1:]))


class DecodeLoop:
    """A replica's decode loop without Ray: keeps `batch` requests in flight, hands each finished one to the
    scoring pool as `RolloutReplica._finish` does, and logs (time, tokens so far) after every step."""

    def __init__(self, engine: Any, scoring: Any, codec: Any, batch: int, max_new_tokens: int) -> None:
        self.engine, self.scoring, self.codec = engine, scoring, codec
        self.batch, self.max_new_tokens = batch, max_new_tokens
        self.log: list[tuple[float, int]] = []
        self.scored: list[float] = []  # when each ordinary trajectory was stored
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="decode", daemon=True)
        self.rng = random.Random(0)
        self.next_id = 0

    def _add(self) -> None:
        from laminar.engine import SamplingParams

        digits = " ".join(str(self.rng.randrange(10)) for _ in range(8))
        prompt = self.codec.encode_prompt(digits)
        params = SamplingParams(seed=self.next_id, max_new_tokens=self.max_new_tokens, ignore_eos=True)
        self.engine.add_request(f"{self.next_id}:0", prompt, params)
        self.next_id += 1

    def _run(self) -> None:
        from laminar.data.records import Trajectory

        tokens = 0
        for _ in range(self.batch):
            self._add()
        while not self.stop.is_set():
            out = self.engine.step()
            tokens += sum(len(t) for t in out.new_tokens.values())
            self.log.append((time.monotonic(), tokens))
            for fin in out.finished:
                group = int(fin.request_id.split(":")[0])
                traj = Trajectory(fin.request_id, group, 0, [], list(fin.output_token_ids), [], version=0)
                row = {
                    **ROW,
                    "row": group,
                }  # a digit answer to a symbolic truth: math-verify's parse and verify
                self.scoring.submit(traj, row, lambda t: self.scored.append(time.monotonic()))
                self._add()

    def rate(self, t0: float, t1: float) -> float:
        """Generated tokens per second between t0 and t1."""
        inside = [(t, n) for t, n in self.log if t0 <= t <= t1]
        if len(inside) < 2:
            return 0.0
        return (inside[-1][1] - inside[0][1]) / (t1 - t0)


def tiny_engine(codec: Any) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from laminar.engine import Engine, ModelConfig

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=codec.vocab_size,
        hidden_size=256,
        intermediate_size=768,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        bos_token_id=codec.bos_id,
        eos_token_id=codec.eos_id,
        pad_token_id=codec.pad_id,
    )
    model = LlamaForCausalLM(config)
    return Engine(ModelConfig.from_hf(config), weights=model.state_dict(), max_num_seqs=16, max_model_len=256)


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def pool_start(reward: str) -> dict[str, Any]:
    """A fresh scorer: its first call (start the worker processes, import the reward, run it), then the mean of
    50 warm calls, the workers' memory, and how long `close` takes."""
    import multiprocessing

    from laminar.data.records import Trajectory
    from laminar.rewards.loader import RewardScorer

    # a symbolic truth, so the math reward's first call imports math-verify and sympy
    scorer = RewardScorer(reward, lambda ids: r"\boxed{2^{1/2}}", timeout_s=30.0)
    row = {"ground_truth": r"\sqrt{2}", "answer": "2 1"}  # the reverse reward reads `answer`
    t = time.perf_counter()
    scorer.score(Trajectory("0:0", 0, 0, [], [], [], version=0), row)
    first = time.perf_counter() - t
    t = time.perf_counter()
    for i in range(50):
        scorer.score(Trajectory(f"{i}:0", i, 0, [], [], [], version=0), row)
    warm = (time.perf_counter() - t) / 50
    workers = [p.pid for p in multiprocessing.active_children() if p.name == "pebble_pool_worker"]
    rss = [round(rss_mb(pid), 1) for pid in workers]
    t = time.perf_counter()
    scorer.close()
    return {
        "reward": reward,
        "processes": scorer.processes,
        "first_call_s": round(first, 3),
        "warm_call_ms": round(warm * 1000, 3),
        "worker_rss_mb": rss,
        "close_s": round(time.perf_counter() - t, 3),
    }


def pool_start_in_ray(rewards: list[str]) -> list[dict[str, Any]]:
    """The same, inside a Ray actor, as a replica holds its scorer (its workers also import Ray's worker script)."""
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)  # never a shared one
    try:
        probe = ray.remote(num_cpus=0)(pool_start)
        return [ray.get(probe.remote(r), timeout=300) for r in rewards]  # one at a time
    finally:
        ray.shutdown()


def isolation(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from laminar.data.records import Trajectory
    from laminar.rewards.loader import RewardScorer, ScoringPool
    from laminar.rollout.replica import SCORE_WORKERS
    from laminar.tasks.reverse import demo_codec

    torch.set_num_threads(1)  # as a replica does
    codec = demo_codec()
    decode = lambda ids: TOWER if ids == BAD_IDS else codec.decode(ids)  # noqa: E731
    reward = "laminar.rewards.math:default_score" if args.reward == "tower" else math_or_bignum
    scoring = ScoringPool(RewardScorer(reward, decode, timeout_s=args.timeout), SCORE_WORKERS)
    loop = DecodeLoop(tiny_engine(codec), scoring, codec, batch=16, max_new_tokens=48)
    ticker = Ticker()
    ticker.thread.start()
    loop.thread.start()
    loop.stop.wait(args.warmup_s)  # the engine's first steps and the scorer's start, not measured
    t_before = time.monotonic()
    loop.stop.wait(args.window_s)
    t_bad = time.monotonic()
    bad_row = TOWER_ROW if args.reward == "tower" else {**ROW, "row": "bignum", "bignum": True}
    bad = Trajectory("bad:0", -1, 0, [], BAD_IDS, [], version=0)
    scoring.submit(bad, bad_row, lambda t: None).result(timeout=args.timeout + 600)
    t_done = time.monotonic()
    loop.stop.wait(args.window_s)
    t_end = time.monotonic()
    loop.stop.set()
    loop.thread.join(30)
    ticker.done.set()
    scoring.shutdown()
    windows = {"before": (t_before, t_bad), "during": (t_bad, t_done), "after": (t_done, t_end)}
    return {
        "load_average_1min": round(os.getloadavg()[0], 2),  # the box is shared: what else ran
        "bad_call": {
            "reward": bad.reward,
            "error": bad.meta.get("reward_error", ""),
            "returned_after_s": round(t_done - t_bad, 3),
        },
        **{
            name: {
                "seconds": round(t1 - t0, 3),
                "tokens_per_s": round(loop.rate(t0, t1), 1),
                "max_thread_stall_s": round(ticker.max_gap(t0, t1), 3),
                "rewards_scored": sum(t0 <= t <= t1 for t in loop.scored),
            }
            for name, (t0, t1) in windows.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reward", choices=("tower", "bignum"), default="tower")
    parser.add_argument("--timeout", type=float, default=2.0, help="the scorer's timeout_s")
    parser.add_argument("--warmup-s", type=float, default=3.0)
    parser.add_argument("--window-s", type=float, default=5.0, help="length of the before and after windows")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--loader", default="", help="score with this copy of laminar/rewards/loader.py")
    parser.add_argument("--no-ray", action="store_true", help="skip the start-up cost inside a Ray actor")
    parser.add_argument("--out", default=str(HERE / "isolation.json"))
    args = parser.parse_args()
    if args.loader:  # before anything imports the real one
        spec = importlib.util.spec_from_file_location("laminar.rewards.loader", args.loader)
        sys.modules["laminar.rewards.loader"] = module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    result: dict[str, Any] = {
        "machine": f"{os.cpu_count()}-core CPU, torch on 1 thread",
        "loader": args.loader or "laminar/rewards/loader.py",
        "reward": args.reward,
        "timeout_s": args.timeout,
        "isolation": [isolation(args) for _ in range(args.repeats)],
    }
    if not args.loader:
        rewards = ["laminar.rewards.reverse:reverse_reward", "laminar.rewards.math:default_score"]
        result["pool_start"] = [pool_start(r) for r in rewards]
        if not args.no_ray:
            result["pool_start_in_ray_actor"] = pool_start_in_ray(rewards)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
