"""The eps_share diagnostic (`pergrad.optim.diagnostics`): the share of coordinates whose
Adam denominator √(v̂ + eps_root) + ε is dominated by ε, against NumPy on a constructed
state, and through `build_optimizer`'s chain, which hands its moments and ε over
(`Optimizer.moments`) and holds nothing for logging."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pergrad.optim import ScheduleConfig, build_optimizer, diagnostics, optimizer_config
from pergrad.optim.adam_family import ScaleByAdamFamilyState
from pergrad.optim.moments import Moments
from pergrad.stats.types import GradStats


def _stats(tree) -> GradStats:
  return GradStats(count=jnp.float32(4), sum=tree, granularity="example")


def test_eps_share_matches_numpy_on_a_constructed_state():
  rng = np.random.default_rng(0)
  nu = {"a": 10.0 ** rng.uniform(-12, -4, size=(5,)), "b": {"k": 10.0 ** rng.uniform(-12, -4,
                                                                                      (3, 4))}}
  weight, eps, eps_root = 0.3, 1e-4, 1e-10
  state = Moments(ScaleByAdamFamilyState(count=jnp.int32(7), mu={"a": jnp.zeros(5),
                                                                  "b": {"k": jnp.zeros((3, 4))}},
                                         nu={"a": jnp.float32(nu["a"]),
                                             "b": {"k": jnp.float32(nu["b"]["k"])}},
                                         nu_weight=jnp.float32(weight)),
                  eps=jnp.float32(eps), eps_root=jnp.float32(eps_root))
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


def test_eps_share_needs_the_adam_familys_moments():
  stats = _stats({"a": jnp.zeros(3)})
  assert diagnostics(stats) == {}
  opt = build_optimizer(optimizer_config("sign", placement="ema"), ScheduleConfig(),
                        total_steps=4, batch_size=4)
  assert opt.moments(opt.tx.init({"a": jnp.zeros(3)})) is None


@pytest.mark.parametrize("eps, want", [(1e-8, 0.0), (1e3, 1.0)])
def test_build_optimizer_holds_eps_for_the_adam_family(eps, want):
  params = {"w": jnp.ones((4, 3))}
  opt = build_optimizer(optimizer_config("adam_family", variant="adam", eps=eps),
                        ScheduleConfig(), total_steps=4, batch_size=4)
  state = opt.tx.init(params)
  g = {"w": jnp.full((4, 3), 0.5)}
  stats = GradStats(count=jnp.float32(4), sum={"w": 4 * g["w"]},
                    coordinate_stats={"sq": {"w": 4 * g["w"] ** 2}}, granularity="example")
  _, state = opt.tx.update(g, state, params, grad_stats=stats, examples_seen=jnp.int32(0),
                           batch_size=4)
  # The ε the optimizer state holds (its numbers, `pergrad.optim.hparams`), once: the
  # chain's own state is count, m, v, v's weight.
  assert opt.moments(state).eps is state.hyperparams["eps"] and state.hyperparams["eps"] == eps
  assert len(jax.tree.leaves(state.inner_state)) == 4
  got = diagnostics(stats, opt.moments(state))
  assert float(got["opt/all/eps_share"]) == want and float(got["opt/w/eps_share"]) == want


def _weighted(u, dominated):
  return float((np.abs(u) * dominated).sum() / np.abs(u).sum())


def test_eps_share_weighted_matches_numpy_on_a_constructed_state():
  """Σ|u|·[ε > √(v̂ + eps_root)] / Σ|u| with u = m̂/(√(v̂ + eps_root) + ε), m̂ = m/(1 − β1^t):
  the debiasing of m cancels, so any β1 gives the same share."""
  rng = np.random.default_rng(1)
  shapes = {"a": (6,), "b/k": (4, 5)}
  mu = {k: rng.normal(size=s) * 10.0 ** rng.uniform(-4, -1, s) for k, s in shapes.items()}
  nu = {k: 10.0 ** rng.uniform(-12, -4, s) for k, s in shapes.items()}
  weight, eps, eps_root, b1, t = 0.3, 1e-4, 1e-10, 0.9, 7
  tree = lambda d, f=jnp.float32: {"a": f(d["a"]), "b": {"k": f(d["b/k"])}}
  state = Moments(ScaleByAdamFamilyState(count=jnp.int32(t), mu=tree(mu), nu=tree(nu),
                                         nu_weight=jnp.float32(weight)),
                  eps=jnp.float32(eps), eps_root=jnp.float32(eps_root))
  got = diagnostics(_stats(tree({k: np.zeros(s) for k, s in shapes.items()})), state)
  u, dom = {}, {}
  for k in shapes:
    root = np.sqrt(nu[k].astype(np.float32) / weight + eps_root)
    u[k] = mu[k].astype(np.float32) / (1 - b1**t) / (root + eps)
    dom[k] = eps > root
    assert 0 < dom[k].mean() < 1
    assert float(got[f"opt/{k}/eps_share_weighted"]) == pytest.approx(_weighted(u[k], dom[k]),
                                                                      rel=1e-5)
    # weighting by |u| differs from counting: ε-dominated coordinates have small steps
    assert float(got[f"opt/{k}/eps_share_weighted"]) != pytest.approx(dom[k].mean(), abs=1e-3)
  flat = lambda d: np.concatenate([np.ravel(d[k]) for k in shapes])
  assert float(got["opt/all/eps_share_weighted"]) == pytest.approx(
      _weighted(flat(u), flat(dom)), rel=1e-5)


def test_eps_share_weighted_reads_the_directions_own_update():
  """After a few updates of the Adam-family direction, the share weighted by the very u
  it returned (NumPy) equals the logged one."""
  from pergrad.optim.adam_family import scale_by_adam_family

  eps = 3e-3
  tx = scale_by_adam_family("micro_adam_msq", eps=eps)
  rng = np.random.default_rng(2)
  params = {"w": jnp.zeros((8, 6)), "b": jnp.zeros(6)}
  state = tx.init(params)
  for _ in range(3):
    g = {k: rng.normal(size=(16, *v.shape)).astype(np.float32) * 0.02 + 0.01
         for k, v in params.items()}
    stats = GradStats(count=jnp.float32(16), sum={k: jnp.sum(x, 0) for k, x in g.items()},
                      coordinate_stats={"sq": {k: jnp.sum(x**2, 0) for k, x in g.items()}},
                      granularity="example")
    u, state = tx.update(stats.mean, state, params, grad_stats=stats)
  got = diagnostics(stats, Moments(state, eps=eps, eps_root=0.0))
  adam = state
  root = {k: np.sqrt(np.asarray(v) / float(adam.nu_weight)) for k, v in adam.nu.items()}
  dom = {k: eps > r for k, r in root.items()}
  uu = {k: np.asarray(x) for k, x in u.items()}
  assert 0 < np.mean(np.concatenate([d.ravel() for d in dom.values()])) < 1
  for k in params:
    assert float(got[f"opt/{k}/eps_share_weighted"]) == pytest.approx(
        _weighted(uu[k], dom[k]), rel=1e-5)
  flat = lambda d: np.concatenate([d[k].ravel() for k in sorted(params)])
  assert float(got["opt/all/eps_share_weighted"]) == pytest.approx(
      _weighted(flat(uu), flat(dom)), rel=1e-5)
