"""The surgery backend on any model: Flax NNX and plain JAX (`pergrad.stats.taps`) against
per-example loops and the Linen twin's explicit per-token contributions; per-example
clipping by surgery against vmap on all three; layer types from the layer class."""

import functools

import any_models as am
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_surgery as ts
from flax import nnx

import pergrad.stats as ps
from pergrad.layer_types import layer_type
from pergrad.loss import make_loss_fn, per_example_xent
from pergrad.stats import noise, taps
from pergrad.stats.surgery import formulas as sm

ALL = ("mean", "sq", "sign", "norms")
KINDS = ("nnx", "plain")


@functools.lru_cache(maxsize=None)
def _samples(kind, tied, B):
  """Per-example gradients of the model (a Python loop of jax.grad), leaves (B, ...)."""
  loss_fn, params, _ = am.models(tied)[kind]
  return ts._per_example_reference(loss_fn, params, am.batch(B))


@functools.lru_cache(maxsize=None)
def _token_samples(tied, B):
  """Per-token contributions, explicit, of the Linen twin (tests/test_surgery.py)."""
  _, params, linen = am.models(tied)["linen"]
  return jax.jit(functools.partial(ts._per_token_reference, linen))(params, am.batch(B))


def _check(stats, samples, want, weights=None):
  """Every asked statistic of the (weighted) samples, leaf by leaf, as test_surgery."""
  samples = jax.device_get(samples)
  if weights is not None:
    samples = jax.tree.map(lambda g: g * weights.reshape((-1,) + (1,) * (g.ndim - 1)), samples)
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(samples))
  check = functools.partial(np.testing.assert_allclose, rtol=1e-4)
  leaves = lambda name: jax.tree.leaves(jax.device_get(stats.get(name)))
  n = jax.tree.leaves(samples)[0].shape[0]
  assert float(stats.count) == n
  for i, g in enumerate(jax.tree.leaves(samples)):
    check(leaves("mean")[i], g.sum(0), atol=1e-6 * scale * n, err_msg=f"sum {i}")
    if "sq" in want:
      check(leaves("sq")[i], np.square(g).sum(0), atol=1e-6 * scale**2, err_msg=f"sq {i}")
    if "sign" in want:
      a = np.abs(g)
      ok = np.all((a == 0) | (a > 1e-5 * scale), axis=0)
      np.testing.assert_allclose(np.where(ok, leaves("sign")[i], 0),
                                 np.where(ok, np.sign(g).sum(0), 0), atol=1e-5)
    if "norms" in want:
      check(leaves("norms")[i], np.square(g).reshape(n, -1).sum(-1), atol=1e-6 * scale**2,
            err_msg=f"norms {i}")


EXT = pytest.mark.extended


@pytest.mark.parametrize("kind,tied,chunk", [
    ("nnx", True, 2), ("plain", False, None), pytest.param("nnx", False, None, marks=EXT),
    pytest.param("plain", True, 2, marks=EXT)])
def test_per_example_matches_loop_with_and_without_microbatches(kind, tied, chunk):
  loss_fn, params, _ = am.models(tied)[kind]
  _, stats = jax.jit(lambda p, b: ps.compute(
      loss_fn, p, b, want=ALL, backend="surgery", microbatch_size=chunk))(params, am.batch(4))
  _check(stats, _samples(kind, tied, 4), ALL)


@pytest.mark.parametrize("tied", [pytest.param(False, marks=EXT), True])
def test_per_token_matches_the_linen_twins_explicit_contributions(tied):
  want = ("mean", "sq", "sign")
  for kind in KINDS:
    loss_fn, params, _ = am.models(tied)[kind]
    _, stats = jax.jit(lambda p, b, f=loss_fn: ps.compute(
        f, p, b, want=want, granularity="token", backend="surgery"))(params, am.batch(3))
    _check(stats, _token_samples(tied, 3), want)


@pytest.mark.parametrize("tied,backends", [
    (False, ("surgery",)), (True, ("surgery",)),
    pytest.param(True, ("vmap",), marks=EXT), pytest.param(False, ("vmap",), marks=EXT)])
def test_clipping_by_surgery_matches_vmap_on_every_model_kind(tied, backends):
  """Some examples clipped, some not; every statistic of the clipped gradients ĝ_b = w_b g_b
  (the loop's per-example gradients, weighted: vmap's definition), by each backend."""
  B = 4
  samples = _samples("nnx", tied, B)  # NNX's arithmetic is Linen's; plain's within rtol
  for kind in ("linen", *KINDS):
    loss_fn, params, _ = am.models(tied)[kind]
    norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1) for g in jax.tree.leaves(samples)))
    C = float(np.median(norms))
    w = np.minimum(1.0, C / norms)
    assert (w < 1).any() and (w == 1).any()
    out = {be: jax.jit(lambda p, b, be=be, f=loss_fn, c=C: ps.compute(
        f, p, b, want=ALL, per_example_clip=c, backend=be))(params, am.batch(B))
        for be in backends}
    for _, stats in out.values():
      _check(stats, samples, ALL, weights=w)


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_layer_kind_comes_from_the_class_names_are_the_fallback():
  """ln1/ln2 are not "norm" by name, but are norm layers: surgery selects them (and
  ln_f) with layers=("norm",) on all three model kinds, and nothing else."""
  assert layer_type("ln1/scale") == "other"
  for kind in ("linen", *KINDS):
    loss_fn, params, _ = am.models(False)[kind]
    _, stats = ps.compute(loss_fn, params, am.batch(2),
                          ps.StatsRequest(("norms",), layers=("norm",)), backend="surgery")
    paths = noise.leaf_paths(params)
    chosen = {p.split("/")[0] for p in paths if stats.selects(p)}
    assert chosen == {"ln1", "ln2", "ln_f"}, (kind, chosen)
    for p, n in zip(paths, jax.tree.leaves(stats.sq_norms), strict=True):
      assert (np.asarray(n) > 0).all() == stats.selects(p), (kind, p)
  rules = ps.StatsRequest(("norms",), layers=("norm",), type_rules=(("ln1*", "mlp"),))
  loss_fn, params, _ = am.models(False)["plain"]
  _, stats = ps.compute(loss_fn, params, am.batch(2), rules, backend="surgery")
  assert not stats.selects("ln1/scale") and stats.selects("ln2/scale")


class _DefaultNames(nn.Module):
  """An LM with Flax's default module names: Embed_0, LayerNorm_0, Dense_0, RMSNorm_0."""

  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(am.V, am.D)(ids)
    x = x + nn.Dense(am.D)(nn.LayerNorm()(x))
    return nn.Dense(am.V)(nn.RMSNorm()(x))


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_default_flax_names_select_exactly_the_norm_layers():
  model = _DefaultNames()
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, am.T), jnp.int32))["params"]
  loss_fn, paths = make_loss_fn(model), noise.leaf_paths(params)
  norm_leaves = {i for i, p in enumerate(paths) if p.split("/")[0] in ("LayerNorm_0",
                                                                        "RMSNorm_0")}
  assert len(norm_leaves) == 3
  assert set(noise.groups_of(paths)["norm"]) == norm_leaves
  assert set(noise.groups_of(paths, layers=("norm",))["total"]) == norm_leaves
  req = ps.StatsRequest(("norms",), layers=("norm",))
  for backend in ("surgery", "vmap"):
    _, stats = ps.compute(loss_fn, params, am.batch(2), req, backend=backend)
    assert {i for i, p in enumerate(paths) if stats.selects(p)} == norm_leaves
  _, surgery = ps.compute(loss_fn, params, am.batch(2), req, backend="surgery")
  nonzero = {i for i, n in enumerate(jax.tree.leaves(surgery.sq_norms)) if np.any(n)}
  assert nonzero == norm_leaves  # surgery touches no other layer


def test_nnx_layers_are_restored_and_taps_are_plain_outside_the_backend():
  originals = {(c, m): c.__dict__.get(m) for c in (nnx.Linear, nnx.Embed, nnx.LayerNorm)
               for m in ("__call__", "attend")}
  loss_fn, params, _ = am.models(True)["nnx"]

  def failing(p, b):
    loss_fn(p, b)
    raise RuntimeError("boom")

  with pytest.raises(RuntimeError, match="boom"):
    ps.compute(failing, params, am.batch(2), want=("sq",), backend="surgery")
  ps.compute(loss_fn, params, am.batch(2), want=("sq",), backend="surgery")
  assert originals == {k: k[0].__dict__.get(k[1]) for k in originals}
  assert not taps.active()
  x, w, b = jnp.ones((2, 3)), jnp.arange(12.0).reshape(3, 4), jnp.ones(4)
  np.testing.assert_allclose(taps.dense(x, w, b), x @ w + b)


def test_a_transformed_parameter_is_refused_by_name():
  loss_fn = lambda p, b: per_example(p, b)
  per_example = lambda p, b: (taps.dense(b["x"], p["w"] * 2.0) ** 2).sum(-1)
  params, batch = {"w": jnp.ones((3, 2))}, {"x": jnp.ones((4, 3))}
  with pytest.raises(ValueError, match="'w': it reaches the loss outside its layer calls.*the "
                     "kernel of the taps.dense call is not a leaf"):
    ps.compute(loss_fn, params, batch, want=("sq",), backend="surgery")


@pytest.mark.parametrize("tied,method", [(True, "separate"), (False, "simultaneous"),
                                         pytest.param(False, "separate", marks=EXT)])
def test_clipping_by_surgery_with_per_example_contractions_matches_the_loop(
    tied, method, monkeypatch):
  """The norms of the dense factors from the per-example contraction instead of the Gram
  ("ghost") form that the test models' shapes choose, or ("simultaneous") the kernels'
  per-example gradients kept: the same clipped sum and norms."""
  monkeypatch.setattr(sm, "ghost_norm_is_cheaper", lambda *shape, **slack: False)
  options = ps.StatsOptions(dense_method=method)
  B, want = 4, ("mean", "norms")
  samples = _samples("nnx", tied, B)
  norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1) for g in jax.tree.leaves(samples)))
  C = float(np.median(norms))
  for kind in ("linen", *KINDS):
    loss_fn, params, _ = am.models(tied)[kind]
    _, stats = jax.jit(lambda p, b, f=loss_fn: ps.compute(
        f, p, b, options=options, want=want, per_example_clip=C, backend="surgery"))(
        params, am.batch(B))
    _check(stats, samples, want, weights=np.minimum(1.0, C / norms))


class _EinsumLM(nnx.Module):
  """nnx.Einsum as dense layers: one contracting D into (heads, features) with a bias over
  both, one contracting (heads, features) back under an ellipsis."""

  def __init__(self, rngs, proj=("btd,dnh->btnh", (am.D, 2, 3))):
    self.wte = nnx.Embed(am.V, am.D, rngs=rngs)
    self.proj = nnx.Einsum(*proj, (2, 3), rngs=rngs)
    self.back = nnx.Einsum("...nh,nhd->...d", (2, 3, am.D), (am.D,), rngs=rngs)
    self.head = nnx.Linear(am.D, am.V, rngs=rngs)

  def __call__(self, ids):
    x = self.wte(ids)
    return self.head(x + self.back(jnp.tanh(self.proj(x))))


def _einsum_loss(model):
  graphdef, params = nnx.split(model, nnx.Param)
  return (lambda p, b: per_example_xent(nnx.merge(graphdef, p)(b["inputs"]), b["targets"]),
          params)


def test_nnx_einsum_layers_match_the_loop_with_and_without_clipping():
  loss_fn, params = _einsum_loss(_EinsumLM(nnx.Rngs(0)))
  params = jax.tree.map(lambda a: a + 0.1, params)  # non-zero biases
  B, batch = 4, am.batch(4)
  samples = ts._per_example_reference(loss_fn, params, batch)
  _, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL, backend="surgery"))(
      params, batch)
  _check(stats, samples, ALL)
  norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1) for g in jax.tree.leaves(samples)))
  C = float(np.median(norms))
  _, clipped = jax.jit(lambda p, b: ps.compute(
      loss_fn, p, b, want=ALL, per_example_clip=C, backend="surgery"))(params, batch)
  _check(clipped, samples, ALL, weights=np.minimum(1.0, C / norms))
  loss_fn, params = _einsum_loss(_EinsumLM(nnx.Rngs(0), ("btd,ndh->btnh", (2, am.D, 3))))
  with pytest.raises(ValueError, match="is not a dense layer"):
    ps.compute(loss_fn, params, batch, want=("sq",), backend="surgery")


@pytest.mark.parametrize("tied", [pytest.param(False, marks=pytest.mark.extended), True])
def test_the_contraction_plain_step_equals_autodiff_on_every_model_kind(tied):
  """ḡ by the fast weight-gradient path (the plain step "auto" takes on CPU) equals
  `jax.value_and_grad`'s on every leaf, for Linen, NNX and plain JAX, and for a model with a
  layer the planner cannot read (a parameter used outside any standard layer: it falls
  back to autodiff)."""
  batch = am.batch(3)
  cases = {k: v[:2] for k, v in am.models(tied).items()}
  loss_fn, params = cases["plain"]
  odd = {**params, "gain": jnp.ones(())}  # a parameter no standard layer owns
  cases["fallback"] = (lambda p, b: loss_fn({k: v for k, v in p.items() if k != "gain"}, b)
                       * p["gain"], odd)
  for kind, (f, p) in cases.items():
    ref = ps.compute(f, p, batch, want=("mean",), backend="value_and_grad")
    got = jax.jit(lambda p_, b_, f=f: ps.compute(f, p_, b_, want=("mean",),
                                                 backend="contraction"))(p, batch)
    np.testing.assert_allclose(got[0], ref[0], rtol=1e-6, err_msg=kind)
    top = max(float(np.abs(b).max()) for b in jax.tree.leaves(ref[1].sum))
    for (path, a), b in zip(jax.tree_util.tree_flatten_with_path(got[1].sum)[0],
                            jax.tree.leaves(ref[1].sum), strict=True):  # key biases: ≈ 0
      np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6 * top,
                                 err_msg=f"{kind} {jax.tree_util.keystr(path)}")
  assert ps.resolve_backend(ps.StatsRequest(("mean",))) == (
      "contraction" if jax.default_backend() == "cpu" else "value_and_grad")
