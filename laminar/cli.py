"""The `laminar` console script: a thin dispatcher; each command's parser lives beside its code."""

from __future__ import annotations

import importlib
import sys

COMMANDS = {
    ("train",): "laminar.train:main",
    ("config",): "laminar.show_config:main",
    ("warmup",): "laminar.tasks.warmup:main",
    ("bench", "engine"): "laminar.bench.engine:main",
    ("bench", "tp"): "laminar.bench.tensor_parallel:main",
    ("bench", "relay"): "laminar.bench.relay:main",
    ("bench", "schedules"): "laminar.bench.schedules:main",
    ("bench", "convergence"): "laminar.bench.convergence:main",
    ("bench", "trainer"): "laminar.bench.trainer:main",
    ("bench", "batches"): "laminar.bench.batches:main",
    ("bench", "seeds"): "laminar.bench.seeds:main",
    ("simulate",): "laminar.sim.cli:main",
    ("audit",): "laminar.telemetry.audit:main",
    ("plot",): "laminar.telemetry.plots:main",
    ("model", "import"): "laminar.models.gguf_import:main",
    ("export",): "laminar.models.export:main",
}

USAGE = """usage: laminar COMMAND [ARGS]

commands:
  train [CONFIG] [key=value ...]   train with the configured schedule (defaults: the embedded CPU demo)
  config [show] [CONFIG] [key=value ...]  print the resolved configuration (YAML) and the reward it scores with
  warmup [--out DIR]               build the demo's warm-start checkpoint (supervised warm-up)
  bench engine                     decode throughput by batch size vs Hugging Face generate
  bench tp                         a tensor-parallel engine's decode step by degree and batch vs its HBM roofline
  bench relay                      weight propagation along the relay chain
  bench schedules                  every schedule on one length-controlled workload
  bench convergence CONFIG         time to each held-out accuracy of one job under several schedules and seeds
  bench trainer                    the trainer step alone on synthetic groups: tokens/s, padding, MFU
  bench batches                    the engine alone on batches of short grouped answers: where a batch's time goes
  bench seeds NAME=DIR... --out D  one table of `bench schedules` over several seeds: ratios per seed and overall
  simulate                         the cluster simulator (64 to 1024 GPUs)
  audit RUN_DIR                    every trajectory trained exactly once, or lost for a reason
  plot RUN_DIR                     the run's plots drawn again from its metrics.jsonl
  model import FILE.gguf --out DIR a .gguf file (only) as a Hugging Face model directory (extra [gguf])
  export RUN_DIR --out DIR         the run's last checkpoint as a Hugging Face model directory
  --version                        the installed version and the digest of its source
"""


def version() -> str:
    """The installed package's version and the digest of the source it runs (`summary.json`'s `code`)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    from laminar.telemetry.provenance import code_digest

    try:
        number = installed("laminar")
    except PackageNotFoundError:
        number = "(not installed)"
    return f"laminar {number} (code {code_digest()})"


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["--version"], ["-V"]):
        print(version())
        return 0
    for words, target in sorted(COMMANDS.items(), key=lambda kv: -len(kv[0])):
        if tuple(argv[: len(words)]) == words:
            module, func = target.split(":")
            return getattr(importlib.import_module(module), func)(argv[len(words) :]) or 0
    print(USAGE, file=sys.stderr)
    return 0 if argv[:1] in (["-h"], ["--help"]) else 2


if __name__ == "__main__":
    sys.exit(main())
