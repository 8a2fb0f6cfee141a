"""Training: mesh, state, jitted steps, loop, Orbax checkpoints, metrics, Hydra CLI.

    from pergrad.train import run
    summary = run(cfg, out_dir)     # cfg: composed Hydra config; see loop.py

Heavy modules are imported lazily so that `pergrad.train.cli` can report config
errors before JAX is loaded.
"""

from __future__ import annotations


def run(cfg, out_dir, **kwargs):
  from pergrad.train.loop import run as _run

  return _run(cfg, out_dir, **kwargs)


__all__ = ["run"]
