"""Training: mesh, state, jitted steps, loop, Orbax checkpoints, metrics, Hydra CLI.

    from pergrad.config import build_plan, compose
    from pergrad.train import run
    summary = run(build_plan(compose(["train.steps=50"])), out_dir)     # see loop.py

Heavy modules are imported lazily so that `pergrad.train.cli` can report config
errors before JAX compiles anything.
"""

from __future__ import annotations


def run(plan, out_dir, **kwargs):
  from pergrad.train.loop import run as _run

  return _run(plan, out_dir, **kwargs)


__all__ = ["run"]
