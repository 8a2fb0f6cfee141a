"""The eps_share diagnostic (`pergrad.optim.diagnostics`): the share of coordinates whose
Adam denominator √(v̂ + eps_root) + ε is dominated by ε, against NumPy on a constructed
state, and through `build_optimizer`'s chain."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from pergrad.optim import ScheduleConfig, build_optimizer, diagnostics, optimizer_config
from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.diagnostics import EpsState, hold_eps
from pergrad.stats.types import GradStats


def _stats(tree) -> GradStats:
  return GradStats(count=jnp.float32(4), sum=tree, sum_sq=None, sum_sign=None,
                   granularity="example")


def test_eps_share_matches_numpy_on_a_constructed_state():
  rng = np.random.default_rng(0)
  nu = {"a": 10.0 ** rng.uniform(-12, -4, size=(5,)), "b": {"k": 10.0 ** rng.uniform(-12, -4,
                                                                                      (3, 4))}}
  weight, eps, eps_root = 0.3, 1e-4, 1e-10
  state = (ScaleByAdamFamilyState(count=jnp.int32(7), mu={"a": jnp.zeros(5),
                                                           "b": {"k": jnp.zeros((3, 4))}},
                                  nu={"a": jnp.float32(nu["a"]),
                                      "b": {"k": jnp.float32(nu["b"]["k"])}},
                                  nu_weight=jnp.float32(weight)),
           EpsState(eps=jnp.float32(eps), eps_root=jnp.float32(eps_root)))
  got = diagnostics(_stats({"a": jnp.zeros(5), "b": {"k": jnp.zeros((3, 4))}}), state)
  dominated = {k: eps > np.sqrt(v / weight + eps_root) for k, v in
               (("a", nu["a"]), ("b/k", nu["b"]["k"]))}
  for k, d in dominated.items():
    assert 0 < d.mean() < 1  # both kinds of coordinate present
    assert float(got[f"opt/{k}/eps_share"]) == pytest.approx(d.mean(), rel=1e-6)
  total = sum(d.sum() for d in dominated.values()) / sum(d.size for d in dominated.values())
  assert float(got["opt/all/eps_share"]) == pytest.approx(total, rel=1e-6)
  # No 'sq' statistic: the shares of v̂ are left out, eps_share is not.
  assert not any("share_mu2" in k for k in got)


def test_eps_share_needs_the_held_eps_and_an_adam_state():
  stats = _stats({"a": jnp.zeros(3)})
  assert diagnostics(stats, EpsState(jnp.float32(1.0), jnp.float32(0.0))) == {}
  with pytest.raises(ValueError, match="eps=-1"):
    hold_eps(-1.0)


@pytest.mark.parametrize("eps, want", [(1e-8, 0.0), (1e3, 1.0)])
def test_build_optimizer_holds_eps_for_the_adam_family(eps, want):
  params = {"w": jnp.ones((4, 3))}
  opt = build_optimizer(optimizer_config("adam_family", variant="adam", eps=eps),
                        ScheduleConfig(), total_steps=4, batch_size=4)
  state = opt.tx.init(params)
  g = {"w": jnp.full((4, 3), 0.5)}
  stats = GradStats(count=jnp.float32(4), sum={"w": 4 * g["w"]},
                    sum_sq={"w": 4 * g["w"] ** 2}, sum_sign=None, granularity="example")
  _, state = opt.tx.update(g, state, params, grad_stats=stats, examples_seen=jnp.int32(0),
                           batch_size=4)
  got = diagnostics(stats, state)
  assert float(got["opt/all/eps_share"]) == want and float(got["opt/w/eps_share"]) == want
