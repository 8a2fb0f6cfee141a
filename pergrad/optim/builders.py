"""The built-in optimizers' directions, registered by name in `pergrad.optim.configs`:
`build(cfg, hp) -> Direction` (`pergrad.optim.types.Direction`), which
`pergrad.optim.build` places in the chain.

sgd: ḡ; momentum: optax.trace(b1) (heavy ball); adam/adamw:
`scale_by_adam_family("adam")` (= optax.scale_by_adam); sign: `scale_by_sign_placement`;
adam_family: `scale_by_adam_family(variant)`. adam and adamw differ only in their config
defaults. The Adam family clips ḡ itself (`clips=True`, so that its statistics follow the
clipping) and hands its state to the diagnostics (`Direction.moments`).
"""

from __future__ import annotations

import optax

from pergrad.optim import configs
from pergrad.optim.adam_family import (
  ScaleByAdamFamilyState,
  request_for_variant,
  scale_by_adam_family,
)
from pergrad.optim.hparams import Hparams
from pergrad.optim.sign import request_for_placement, scale_by_sign_placement
from pergrad.optim.types import Direction


def sgd(cfg, hp: Hparams) -> Direction:
  del cfg, hp
  return Direction(optax.identity())


def momentum(cfg: configs.MomentumConfig, hp: Hparams) -> Direction:
  del cfg
  return Direction(optax.trace(decay=hp.b1))


def adam(cfg: configs.AdamConfig, hp: Hparams) -> Direction:
  del cfg
  tx = scale_by_adam_family("adam", hp.b1, hp.b2, hp.eps, hp.eps_root, clip_norm=hp.clip_norm)
  return Direction(tx, clips=True, moments=_own_state)


def sign(cfg: configs.SignConfig, hp: Hparams) -> Direction:
  placement = cfg.placement
  return Direction(scale_by_sign_placement(placement, hp.b1), request_for_placement(placement))


def adam_family(cfg: configs.AdamFamilyConfig, hp: Hparams) -> Direction:
  variant = cfg.variant
  tx = scale_by_adam_family(variant, hp.b1, hp.b2, hp.eps, hp.eps_root, cfg.mix_a, cfg.mix_b,
                            clip_norm=hp.clip_norm)
  return Direction(tx, request_for_variant(variant), clips=True, moments=_own_state)


def _own_state(state: ScaleByAdamFamilyState) -> ScaleByAdamFamilyState:
  """`scale_by_adam_family`'s state is its moments."""
  return state
