"""Sweeps of `python -m pergrad.train` Hydra runs: declared, launched, reused and carried. It reads
runs through `pergrad.analysis` and `pergrad.files` alone (no JAX on import).

  grid      `Block` (a grid launched as one multirun), `Sweep`, sweep directories, sweep.json
  search    the lr search a sweep declares: `LrSearch`, `Tuned`, `MoreSeeds`
  rounds    its rounds: the best lr per group (`best_lr`), the next blocks (`follow_up_blocks`);
            `growth` (where its grids start and grow), `more_seeds` (seeds after a pilot)
  presets   the scale presets (configs/scale/), the checkout's configs, default directories
  launch    `launch_blocks`: one multirun per block with a point not finished (basic, joblib,
            submitit/SLURM launchers), `LaunchLog`
  reuse     `RunIndex`: a finished run found by its config and training version, linked
  carry     `carry.pack` / `carry.unpack`: a stopped sweeps root moved to another machine

    blocks = (Block({"optimizer.lr": [1e-3, 3e-3], "train.seed": [0, 1]}),)
    log = launch_blocks(sweep_dir(root, "mine", "cpu"), {"scale": "cpu"}, blocks,
                        launcher="joblib", index=RunIndex.at(root))  # root: your sweeps root
"""

from __future__ import annotations

from pergrad.sweep import carry, growth, more_seeds, rounds
from pergrad.sweep.grid import (
  SWEEP_JSON,
  Block,
  Sweep,
  config_extras,
  override_key,
  record_sweep,
  sweep_dir,
)
from pergrad.sweep.launch import (
  LAUNCHERS,
  TRAIN_CMD,
  How,
  LaunchLog,
  launch_blocks,
  multirun_command,
  run_overrides,
  waves,
)
from pergrad.sweep.presets import (
  PRESETS,
  REPO,
  RESULTS,
  RUNG_PRESETS,
  SEEDS,
  base_for,
  check_preset,
  config_value,
  default_results_dir,
  default_sweep_dir,
  experiment_value,
  family,
  is_rung,
  scale_file,
  scale_value,
)
from pergrad.sweep.reuse import (
  CARRIED,
  INDEX,
  REUSED,
  RunIndex,
  drop_broken_link,
  is_reused,
  is_whole,
  recorded_version,
  run_key,
  training_version,
)
from pergrad.sweep.rounds import (
  WARMUP,
  best_lr,
  common_seeds,
  factor_of,
  follow_up_blocks,
  marked_finals,
  with_warmup,
)
from pergrad.sweep.search import MIN_PILOT, POLICY, LrSearch, MoreSeeds, Tuned

__all__ = [
    "CARRIED", "INDEX", "LAUNCHERS", "MIN_PILOT", "POLICY", "PRESETS", "REPO", "RESULTS", "REUSED",
    "RUNG_PRESETS", "SEEDS", "SWEEP_JSON", "TRAIN_CMD", "WARMUP", "Block", "How", "LaunchLog",
    "LrSearch", "MoreSeeds", "RunIndex", "Sweep", "Tuned", "base_for", "best_lr", "carry",
    "check_preset", "common_seeds", "config_extras", "config_value", "default_results_dir",
    "default_sweep_dir", "drop_broken_link", "experiment_value", "factor_of", "family",
    "follow_up_blocks", "growth", "is_reused", "is_rung", "is_whole", "launch_blocks",
    "marked_finals", "more_seeds", "multirun_command", "override_key", "record_sweep",
    "recorded_version", "rounds", "run_key", "run_overrides", "scale_file", "scale_value",
    "sweep_dir", "training_version", "waves", "with_warmup",
]
