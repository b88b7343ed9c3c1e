"""`laminar config [show] [CONFIG] [key=value ...]`: the resolved configuration as YAML and the reward it would
score with. A command above both `laminar.config` (the root, which imports no reward) and `laminar.rewards.stop`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from laminar.config import ConfigError
from laminar.configure import load_config
from laminar.rewards.stop import choose_reward


def main(argv: list[str] | None = None) -> int:
    """`laminar config [show] [CONFIG] [key=value ...]`: the resolved configuration as YAML (what `laminar train`
    with the same arguments would run, and writes to RUN_DIR/config.yaml), and the reward it would score with."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["show"] and not Path("show").is_file():  # `laminar config show ...` reads as it says
        argv = argv[1:]
    ap = argparse.ArgumentParser(prog="laminar config", description=main.__doc__)
    ap.add_argument("config", nargs="?", help="YAML config file (optional; defaults are the CPU demo)")
    ap.add_argument("overrides", nargs="*", help="dotted overrides, e.g. trainer.lr=1e-5")
    args = ap.parse_args(argv)
    config, overrides = args.config, list(args.overrides)
    if config and "=" in config:  # only overrides were given
        config, overrides = None, [config, *overrides]
    try:
        cfg = load_config(config, overrides)
    except ConfigError as e:
        print(f"laminar config: bad configuration: {e}", file=sys.stderr)
        return 2
    choice = choose_reward(cfg)
    print(yaml.safe_dump(cfg.to_dict(), sort_keys=False), end="")
    print(f"# reward in use: {choice.path}: {choice.why}")
    return 0
