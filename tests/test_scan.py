"""Surgery through scanned layer stacks: `jax.lax.scan`, Linen `nn.scan`, `nnx.scan`, each
with and without remat, stacked leaves [L, ...]: every statistic on every leaf equals a
float64 `jax.vmap(jax.grad)` reference's (per-example gradient of a stacked leaf [B, L, ...]);
what the proof cannot read (weights shared across iterations, a reshaped stack) is refused
by name.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from any_models import NnxResidualBlock
from flax import linen as nn
from flax import nnx

import pergrad.stats as ps
from pergrad.stats import taps
from pergrad.stats.surgery.sites import Unsupported, make_plan

B, T, D, V, L = 3, 4, 6, 11, 3
ALL = ("mean", "sq", "sign", "norms")


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32),
          "targets": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)}


def _xent(logits, targets):
  logp = jax.nn.log_softmax(logits.astype(jnp.promote_types(logits.dtype, jnp.float32)))
  return -jnp.take_along_axis(logp, targets[..., None], -1)[..., 0].mean(-1)


# --- plain JAX: lax.scan over stacked params, taps -----------------------------------------
def _plain(remat):
  rng = np.random.default_rng(1)
  n = lambda *s: jnp.asarray(0.3 * rng.standard_normal(s), jnp.float32)
  params = {"wte": n(V, D), "stack": {"w": n(L, D, D), "b": n(L, D), "g": 1 + n(L, D)},
            "head": n(D, V)}

  def block(h, p):
    return h + jnp.tanh(taps.dense(taps.rms_norm(h, p["g"]), p["w"], p["b"])), None

  def loss_fn(p, b):
    h = taps.embed(b["inputs"], p["wte"])
    h, _ = jax.lax.scan(jax.checkpoint(block) if remat else block, h, p["stack"])
    return _xent(taps.dense(h, p["head"]), b["targets"])
  return loss_fn, params


# --- Linen nn.scan ---------------------------------------------------------------------------
class _LinenBlock(nn.Module):
  @nn.compact
  def __call__(self, h, _):
    return h + jnp.tanh(nn.Dense(D)(nn.LayerNorm()(h))), None


class _LinenLM(nn.Module):
  remat: bool

  @nn.compact
  def __call__(self, ids):
    h = nn.Embed(V, D)(ids)
    block = nn.remat(_LinenBlock, prevent_cse=False) if self.remat else _LinenBlock
    h, _ = nn.scan(block, variable_axes={"params": 0}, split_rngs={"params": True},
                   length=L)(name="layers")(h, None)
    return nn.Dense(V)(nn.RMSNorm()(h))


def _linen(remat):
  model = _LinenLM(remat)
  params = model.init(jax.random.key(0), _batch()["inputs"])["params"]
  return lambda p, b: _xent(model.apply({"params": p}, b["inputs"]), b["targets"]), params


# --- NNX nnx.scan ----------------------------------------------------------------------------
class _NnxLM(nnx.Module):
  def __init__(self, remat, rngs):
    self.remat = remat
    self.wte = nnx.Embed(V, D, rngs=rngs)

    @nnx.split_rngs(splits=L)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def blocks(r):
      return NnxResidualBlock(D, r)
    self.blocks = blocks(rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, ids):
    step = lambda blk, h: blk(h)
    step = nnx.remat(step) if self.remat else step
    h = self.wte(ids).astype(jnp.result_type(float))  # nnx.Embed's output: float32
    h = nnx.scan(step, in_axes=(0, nnx.Carry), out_axes=nnx.Carry)(self.blocks, h)
    return self.head(h)


def _nnx(remat):
  graphdef, params = nnx.split(_NnxLM(remat, nnx.Rngs(0)), nnx.Param)
  params = nnx.to_pure_dict(params)

  def loss_fn(p, b):
    model = nnx.merge(graphdef, nnx.State(p))
    return _xent(model(b["inputs"]), b["targets"])
  return loss_fn, params


MODELS = {"lax": _plain, "linen": _linen, "nnx": _nnx}


def _reference(loss_fn, params, batch):
  """Per-example gradients [B, ...] in float64: jax.vmap(jax.grad) of loss_b."""
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda a: jnp.asarray(a, jnp.float64), params)
    one = lambda p, b: loss_fn(p, jax.tree.map(lambda a: a[None], b))[0]
    return jax.device_get(jax.vmap(jax.grad(one), in_axes=(None, 0))(p64, batch))


def _check(stats, g):
  """Every statistic of stats on every leaf against the float64 samples g [B, ...]."""
  stats, flat = jax.device_get(stats), jax.tree_util.tree_flatten_with_path(g)[0]
  scale = max(float(np.abs(x).max()) for x in jax.tree.leaves(g))
  for kp, x in flat:
    get = lambda t, kp=kp: _at(t, kp)
    name = jax.tree_util.keystr(kp)
    close = lambda a, b, s, what, name=name: np.testing.assert_allclose(
        a, b, rtol=1e-4, atol=1e-6 * s, err_msg=f"{what} {name}")
    close(get(stats.sum), x.sum(0), scale, "sum")
    close(get(stats.coordinate_stats["sq"]), np.square(x).sum(0), scale**2, "sq")
    ok = np.all((x == 0) | (np.abs(x) > 1e-5 * scale), axis=0)
    np.testing.assert_allclose(np.where(ok, get(stats.coordinate_stats["sign"]), 0),
                               np.where(ok, np.sign(x).sum(0), 0), atol=1e-5,
                               err_msg=f"sign {name}")
    close(get(stats.example_stats["norms"]), np.square(x).reshape(B, -1).sum(-1), scale**2,
          "norms")


def _at(tree, kp):
  for k in kp:
    tree = tree[getattr(k, "key", getattr(k, "name", k))]
  return tree


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
@pytest.mark.parametrize("frontend", list(MODELS))
def test_scanned_stack_matches_float64_vmap(frontend, remat):
  loss_fn, params = MODELS[frontend](remat)
  batch = _batch()
  plan = make_plan(loss_fn, params, batch, ps.StatsRequest(ALL))
  assert not plan.refused, plan.refused
  assert any(s.lifted >= 0 for s in plan.sites)
  stacked = [x for x in jax.tree.leaves(params) if x.ndim and x.shape[0] == L]
  assert stacked, "the model has stacked leaves"
  loss, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, ps.StatsRequest(ALL),
                                                backend="surgery"))(params, batch)
  np.testing.assert_allclose(loss, loss_fn(params, batch).mean(), rtol=1e-6)
  _check(stats, _reference(loss_fn, params, batch))


def test_auto_takes_surgery_for_a_scanned_stack():
  loss_fn, params = _linen(True)
  assert ps.decide(loss_fn, params, _batch(), ps.StatsRequest(ALL)) == "surgery"


def _shared(p, b):
  """One weight closed over by every iteration (shared across layers)."""
  h = taps.embed(b["inputs"], p["wte"])
  h, _ = jax.lax.scan(lambda h, _: (h + taps.dense(h, p["w"]), None), h, None, length=L)
  return _xent(taps.dense(h, p["head"]), b["targets"])


def _reshaped(p, b):
  """The stack [D, L, D] scanned after a transpose: the slice is not a slice of the leaf."""
  h = taps.embed(b["inputs"], p["wte"])
  h, _ = jax.lax.scan(lambda h, w: (h + taps.dense(h, w), None), h,
                      jnp.swapaxes(p["w"], 0, 1))
  return _xent(taps.dense(h, p["head"]), b["targets"])


@pytest.mark.parametrize("loss_fn,leaf,words", [(_shared, "w", "loop constant"),
                                                (_reshaped, "w", "reshaped")])
def test_what_the_proof_cannot_read_is_refused_by_name(loss_fn, leaf, words):
  rng = np.random.default_rng(2)
  w = (D, L, D) if loss_fn is _reshaped else (D, D)
  params = {"wte": jnp.asarray(rng.standard_normal((V, D)), jnp.float32),
            "w": jnp.asarray(0.1 * rng.standard_normal(w), jnp.float32),
            "head": jnp.asarray(rng.standard_normal((D, V)), jnp.float32)}
  plan = make_plan(loss_fn, params, _batch(), ps.StatsRequest(ALL))
  assert dict(plan.refused).keys() == {leaf}, plan.refused
  assert words in dict(plan.refused)[leaf]
  with pytest.raises(Unsupported, match=f"'{leaf}'.*{words}"):
    ps.compute(loss_fn, params, _batch(), ps.StatsRequest(ALL), backend="surgery")


@pytest.mark.parametrize("remat", [False, True], ids=["plain", "remat"])
def test_clipping_through_a_scan_is_refused_naming_the_lifting_primitives(remat):
  """The refusal names what lifts the call: the scan, and the checkpoint inside it."""
  loss_fn, params = _plain(remat)
  request = ps.StatsRequest(ALL, per_example_clip=1.0)
  why = dict(make_plan(loss_fn, params, _batch(), request).refused)["stack/w"]
  assert ("jax.lax.scan (nn.scan, nnx.scan) / jax.checkpoint (remat)" if remat else
          "inside jax.lax.scan (nn.scan, nnx.scan)\n") in why + "\n", why
