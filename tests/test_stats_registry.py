"""A statistic registered through the public recipe is computed by every backend.

Toy statistics, registered by a fixture and unregistered afterwards:
  - "abs":  Σ_n |g_n| per coordinate (multiplicative, clip_power 1): per token too;
  - "l1":   Σ_coords |g_b| per example and leaf (kind "example", clip_power 1);
  - "relu": Σ_n max(g_n, 0) per coordinate (NOT multiplicative: example granularity only);
  - "tanh": Σ_n tanh(g_n) per coordinate (no clip_power: the vmap backend cannot clip it).
References: the loop backend (`pergrad.stats.reference`), itself checked against NumPy
sums of per-example gradients, and the explicit per-token contributions of
tests/test_surgery.py. Model: B=3 or 4, T=5, V=17, d_model=12, d_ff=20 (all different).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_surgery as ts  # the per-example / per-token references and the small models

import pergrad.stats as ps
from pergrad.optim.common import require_stats
from pergrad.stats import registry
from pergrad.stats.noise import leaf_path as leaf_name
from pergrad.stats.summaries import layer_summaries

NAMES = ("untied-ln-learned-bias", "tied-rms-rope")
TOYS = {
    "abs": ps.Statistic("abs", "coordinate", jnp.abs, clip_power=1, multiplicative=True,
                        doc="Σ_n |g_n| per coordinate"),
    "l1": ps.Statistic("l1", "example", jnp.abs, clip_power=1, multiplicative=True,
                       doc="‖g_b‖₁ = Σ_coords |g_b| per example and leaf",
                       summarize=lambda v, n: {"l1_max": jnp.max(v)}),
    "relu": ps.Statistic("relu", "coordinate", lambda x: jnp.maximum(x, 0.0), clip_power=1,
                         doc="Σ_n max(g_n, 0) per coordinate"),
    "tanh": ps.Statistic("tanh", "coordinate", jnp.tanh, doc="Σ_n tanh(g_n) per coordinate"),
}
NUMPY_PHI = {"abs": np.abs, "l1": np.abs, "relu": lambda x: np.maximum(x, 0.0),
             "tanh": np.tanh, "sq": np.square}
WANT = ("mean", "sq", "abs", "l1", "relu", "norms")


@pytest.fixture(scope="module", autouse=True)
def toy_statistics():
  for st in TOYS.values():
    ps.register(st)
  yield
  for name in TOYS:
    ps.unregister(name)
  assert not set(TOYS) & set(ps.STATISTICS)


@functools.lru_cache(maxsize=None)
def _jit_compute(loss_fn, want, **kw):
  return jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=want, **kw))


def _compute(loss_fn, params, batch, want, **kw):
  return _jit_compute(loss_fn, want, **dict(sorted(kw.items())))(params, batch)


@functools.lru_cache(maxsize=None)
def _reference(name, B, want=WANT, clip=None):
  """(setup, loss, stats) of the loop backend (eager, one example at a time)."""
  model, loss_fn, params, batch = ts._setup(name, B)
  loss, stats = ps.compute(loss_fn, params, batch, want=want, backend="loop",
                           per_example_clip=clip)
  return (model, loss_fn, params, batch), loss, jax.device_get(stats)


def _assert_trees_close(actual, expected, what, rtol=1e-4):
  """allclose on every leaf (same tree structure), atol scaled to the largest value of the
  whole tree: some leaves (the attention key bias) have a gradient that is zero up to
  float32 noise."""
  flat_e = jax.tree_util.tree_flatten_with_path(expected)[0]
  flat_a, tree_a = jax.tree_util.tree_flatten(actual)
  assert tree_a == jax.tree_util.tree_structure(expected), what
  assert len(flat_a) == len(flat_e) > 0, what
  scale = max(float(np.abs(np.asarray(e)).max()) for _, e in flat_e)
  for (path, e), a in zip(flat_e, flat_a, strict=True):
    np.testing.assert_allclose(np.asarray(a, np.float64), np.asarray(e, np.float64), rtol=rtol,
                               atol=1e-6 * scale + 1e-12, err_msg=f"{what} at {leaf_name(path)}")


def _check_against(stats, ref, names):
  assert float(stats.count) == float(ref.count)
  _assert_trees_close(stats.sum, ref.sum, "sum")
  for k in names:
    _assert_trees_close(stats.get(k), ref.get(k), k)


# --- the reference itself -------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_reference_matches_numpy_of_per_example_grads(name):
  _, _, stats = _reference(name, 3)
  g = jax.tree.map(lambda x: np.asarray(x, np.float64), ts.per_example_samples(name, 3))
  for k in ("abs", "relu", "sq"):
    _assert_trees_close(stats.coord(k), jax.tree.map(lambda x, k=k: NUMPY_PHI[k](x).sum(0), g), k)
  _assert_trees_close(stats.per_example("l1"),
                      jax.tree.map(lambda x: np.abs(x).reshape(3, -1).sum(1), g), "l1")
  assert set(stats.coordinate_stats) == {"sq", "abs", "relu"}
  assert set(stats.example_stats) == {"l1", "norms"}


# --- every backend, every leaf --------------------------------------------------------------
@pytest.mark.parametrize("backend", ["vmap", "surgery"])
@pytest.mark.parametrize("name", NAMES)
def test_backend_matches_reference(name, backend):
  (_, loss_fn, params, batch), loss_ref, ref = _reference(name, 3)
  loss, stats = _compute(loss_fn, params, batch, WANT, backend=backend)
  np.testing.assert_allclose(float(loss), float(loss_ref), rtol=1e-5)
  assert stats.granularity == "example"
  _check_against(stats, ref, ("sq", "abs", "relu", "l1", "norms"))
  # the built-ins read through the historical names and the generic accessors alike
  _assert_trees_close(stats.sum_sq, stats.coord("sq"), "sum_sq")
  _assert_trees_close(stats.sq_norms, stats.per_example("norms"), "sq_norms")


@pytest.mark.parametrize("name", NAMES)
def test_surgery_per_token_matches_explicit_contributions(name):
  _, loss_fn, params, batch = ts._setup(name, 3)
  samples = jax.tree.map(lambda x: np.asarray(x, np.float64), ts.per_token_samples(name, 3))
  _, stats = _compute(loss_fn, params, batch, ("mean", "sq", "abs"), backend="surgery",
                      granularity="token")
  assert stats.granularity == "token" and float(stats.count) == 3 * ts.T
  assert set(stats.coordinate_stats) == {"sq", "abs"} and not stats.example_stats
  _assert_trees_close(stats.coord("abs"), jax.tree.map(lambda g: np.abs(g).sum(0), samples),
                      "per-token abs")
  _assert_trees_close(stats.coord("sq"), jax.tree.map(lambda g: np.square(g).sum(0), samples),
                      "per-token sq")
  _assert_trees_close(stats.mean, jax.tree.map(lambda g: g.mean(0), samples), "per-token mean")


def test_microbatched_vmap_matches_reference():
  (_, loss_fn, params, batch), _, ref = _reference("tied-rms-rope", 4)
  _, stats = _compute(loss_fn, params, batch, WANT, backend="vmap", microbatch_size=2)
  _check_against(stats, ref, ("sq", "abs", "relu", "l1", "norms"))


def test_per_example_clip_vmap_matches_reference():
  name, B = "untied-ln-learned-bias", 4
  (_, loss_fn, params, batch), _, plain = _reference(name, B)
  norms = np.sqrt(np.asarray(plain.total_sq_norms))
  clip = float(np.median(norms))  # some examples clipped, some not
  assert (norms > clip).any() and (norms < clip).any()
  _, _, ref = _reference(name, B, clip=clip)
  _, stats = _compute(loss_fn, params, batch, WANT, backend="vmap", per_example_clip=clip)
  _check_against(stats, ref, ("sq", "abs", "relu", "l1", "norms"))
  # the vmap backend needs a clip_power; the loop backend clips any statistic
  with pytest.raises(ValueError, match=r"'tanh' has no clip_power.*backend='loop'"):
    _compute(loss_fn, params, batch, ("mean", "tanh"), backend="vmap", per_example_clip=clip)
  _, _, tanh_ref = _reference(name, B, want=("mean", "tanh"), clip=clip)
  assert jax.tree.leaves(tanh_ref.coord("tanh"))


def test_merge_of_two_parts_equals_whole():
  (_, loss_fn, params, batch), _, whole = _reference("tied-rms-rope", 4)
  part = lambda sl: _compute(loss_fn, params, jax.tree.map(lambda x: x[sl], batch), WANT,
                             backend="vmap")[1]
  merged = part(slice(0, 1)).merge(part(slice(1, 4)))
  _check_against(merged, whole, ("sq", "abs", "relu", "l1", "norms"))
  with pytest.raises(ValueError, match="different statistics"):
    merged.merge(ps.GradStats(count=merged.count, sum=merged.sum,
                              coordinate_stats={"sq": merged.sum_sq}))


def test_summaries_log_registered_statistics():
  _, _, stats = _reference("untied-ln-learned-bias", 3)
  got = jax.jit(layer_summaries)(stats)
  flat = jax.tree_util.tree_flatten_with_path(stats.sum)[0]
  for (path, _), a, r, l1 in zip(flat, jax.tree.leaves(stats.coord("abs")),
                                 jax.tree.leaves(stats.coord("relu")),
                                 jax.tree.leaves(stats.per_example("l1")), strict=True):
    key = f"stats/{leaf_name(path)}"
    np.testing.assert_allclose(float(got[f"{key}/abs_mean"]), np.mean(a) / 3, rtol=1e-5)
    np.testing.assert_allclose(float(got[f"{key}/relu_mean"]), np.mean(r) / 3, rtol=1e-5)
    np.testing.assert_allclose(float(got[f"{key}/l1_max"]), np.max(l1), rtol=1e-6)  # summarize
    assert f"{key}/var_mean" in got and f"{key}/norm_p50" in got  # the dedicated ones stay
  assert not any(k.endswith("sq_mean") or k.endswith("norms_mean") for k in got)


def test_registry_api_and_errors():
  assert tuple(ps.STATISTICS)[:4] == ("mean", "sq", "sign", "norms")
  assert {"abs", "l1"} <= set(ps.STATISTICS) and "abs" in ps.STATISTICS
  assert registry.get("abs") is TOYS["abs"] and registry.get("sq").clip_power == 2
  with pytest.raises(ValueError, match="already registered"):
    ps.register(TOYS["abs"])
  ps.register(TOYS["abs"], replace=True)
  with pytest.raises(ValueError, match="cannot be redefined"):
    ps.register(ps.Statistic("sq", "coordinate", jnp.square), replace=True)
  with pytest.raises(ValueError, match="kind="):
    ps.Statistic("bad", "layer", jnp.abs)
  with pytest.raises(ValueError, match="unknown statistic 'nope'"):
    registry.get("nope")
  model, loss_fn, params, batch = ts._setup("tied-rms-rope", 3)
  # per-token: multiplicative coordinate statistics only, one clear line otherwise
  with pytest.raises(ValueError, match=r"'relu'.*non-multiplicative.*granularity='example'"):
    ps.compute(loss_fn, params, batch, want=("relu",), granularity="token")
  with pytest.raises(ValueError, match=r"'l1'.*only at granularity='example'"):
    ps.compute(loss_fn, params, batch, want=("l1",), granularity="token")
  # a GradStats without the statistic: one line naming the fix
  stats = ps.GradStats(count=jnp.float32(3), sum=params)
  with pytest.raises(ValueError, match=r"without 'abs'; add 'abs' to `want`"):
    stats.coord("abs")
  with pytest.raises(ValueError, match="needs the 'abs' statistic"):
    require_stats(stats, "toy optimizer", need=("abs",))
  _, _, ref = _reference("tied-rms-rope", 3)
  assert require_stats(ref, "toy optimizer", need=("abs", "l1")) is ref
