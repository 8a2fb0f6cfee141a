"""The per-leaf fallback (`surgery_vmap`): a refused leaf whose example-free slice meets the
batch only by broadcasting against the example axis gets its per-example gradient from
surgery's own backward pass (`surgery/cuts.py`), any other from the whole-loss vmap; every
statistic of every leaf equals the float64 per-example loop's (`any_models.reference64`),
and the test names the leaves each route served.
"""

import warnings

import any_models as am
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_scan
import test_stats_exact as tse

import pergrad.stats as ps
from pergrad.loss import per_example_xent
from pergrad.stats import taps
from pergrad.stats.surgery import cuts, sites

ALL = ("mean", "sq", "sign", "norms")
V, T, D = am.V, am.T, am.D


class _PositionsLM(nn.Module):
  """Learned positions added to the tokens' embeddings, explicitly broadcast to the batch's
  shape inside the slice (`explicit`: not cut) or by the add itself (cut)."""

  explicit: bool = False

  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(V, D, name="wte")(ids)
    pos = nn.Embed(T, D, name="wpe")(jnp.arange(T))
    x = x + (jnp.broadcast_to(pos, x.shape) if self.explicit else pos)
    return nn.Dense(V, name="head")(jnp.tanh(nn.Dense(D, name="up")(x)))


def _positions(explicit=False, penalty=True):
  """The bench's pattern: loss_b + λ‖E_pos‖² (a scalar broadcast against the losses)."""
  model = _PositionsLM(explicit)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
  params = jax.tree.map(lambda a: a + 0.3, params)

  def loss_fn(p, b):
    xent = per_example_xent(model.apply({"params": p}, b["inputs"]), b["targets"])
    return xent + 0.05 * penalty * jnp.sum(jnp.square(p["wpe"]["embedding"]))

  return loss_fn, params


def _time_major(p, b):
  """A bare gain vector on a time-major [T, B, D] activation: the example axis is not the
  leading one (and B = T in the test: only the trace at B + 1 tells them apart)."""
  x = jnp.swapaxes(taps.embed(b["inputs"], p["wte"]), 0, 1) * p["gain"]
  h = jnp.swapaxes(jnp.tanh(taps.dense(x, p["up"]["kernel"], p["up"]["bias"])), 0, 1)
  return per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])


def _gain_params():
  rng = np.random.default_rng(1)
  return {**tse._plain_params(), "gain": jnp.asarray(1 + 0.3 * rng.standard_normal(D),
                                                     jnp.float32)}


def _scanned(remat=True):
  """A lax.scan over stacked layers (`test_scan`) beside a bare leaf in a penalty: the
  lifted calls' placeholders and the cut in one pass."""
  loss_fn, params = test_scan._plain(remat)
  gain = jnp.linspace(0.5, 1.5, D, dtype=jnp.float32)
  return (lambda p, b: loss_fn(p, b) + 0.05 * jnp.sum(jnp.square(p["gain"])),
          {**params, "gain": gain})


CASES = {  # name -> (loss_fn, params, B, the refused leaves served by cuts, by vmap)
    "penalty": (tse._penalty, tse._plain_params(), 4, {"up/bias"}, {"up/kernel"}),
    "raw_tie": (tse._raw_tie, tse._plain_params(), 4, {"up/bias"}, {"up/kernel"}),
    "alibi": (*tse._bias_table("alibi"), 4, {"slopes/embedding"}, set()),
    "relative": (*tse._bias_table("relative"), 4, {"rel/embedding"}, set()),
    "positions_penalty": (*_positions(), 4, {"wpe/embedding"}, set()),
    "explicit_broadcast": (*_positions(explicit=True, penalty=False), 4, set(),
                           {"wpe/embedding"}),
    "time_major_B_eq_T": (_time_major, _gain_params(), T, {"gain"}, set()),
    "scan_penalty": (*_scanned(), 4, {"gain"}, set()),
}


@pytest.mark.parametrize("name", list(CASES))
def test_the_fallback_is_exact_and_cheap_where_it_can_be(name, monkeypatch):
  loss_fn, params, B, fast, slow = CASES[name]
  batch = am.batch(B)
  seen = []
  find = cuts.find
  monkeypatch.setattr(cuts, "find", lambda *a: seen.append(find(*a)) or seen[-1])
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    _, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL,
                                               backend="surgery_vmap"))(params, batch)
  assert am.mismatches(stats, am.reference64(loss_fn, params, batch)) == []
  _, paths, _ = sites.leaf_keys(params)
  refused = dict(ps.api.make_plan(loss_fn, params, batch, ps.StatsRequest(ALL)).refused)
  got = {paths[i] for c in seen for i in c.leaves}
  assert (got, set(refused) - got) == (fast, slow)
  for platform in ("cpu", "gpu"):  # on CPU only where every refused leaf is cut
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      which = ps.decide(loss_fn, params, batch, ps.StatsRequest(ALL), platform=platform)
    assert which == ("vmap" if slow and platform == "cpu" else "surgery_vmap"), platform
