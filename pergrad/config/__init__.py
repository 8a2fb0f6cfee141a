"""The config floor: Hydra schema, composition and plugins, and the frozen run plan.

    from pergrad.config import build_plan, compose
    plan = build_plan(compose(["optimizer=sign", "train.steps=50"]), n_devices)

Modules: `schema` (the plain dataclasses Hydra composes `configs/` against), `batch` (the
batch-size schedule's settings and its frozen plan), `compose` (ConfigStore, the configs'
folder, plugins imported once, `compose`), `help` (the `--help` page), `plan` (`RunPlan`,
`build_plan`, the resume fingerprint). Imports nothing from `pergrad.train`.
"""

from pergrad.config.composer import compose, configs_dir, load_plugins
from pergrad.config.plan import (
    RunPlan,
    StatsPlan,
    build_plan,
    fingerprint,
    resume_decision,
    to_config,
    to_plain,
)
from pergrad.config.schema import Config

__all__ = ["Config", "RunPlan", "StatsPlan", "build_plan", "compose", "configs_dir",
           "fingerprint", "load_plugins", "resume_decision", "to_config", "to_plain"]
