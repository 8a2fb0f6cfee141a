"""Separable or refused: a model whose per-example loss depends on other examples of the
batch (batch statistics, BatchNorm in training mode, a loss normalised by a batch
statistic) has no per-example gradients that any backend computes, so every backend
refuses it with one `Unsupported` line naming the operation and the fix
(`pergrad.stats.separable`); models that use the batch axis harmlessly (per-example norms,
attention within an example, masks) stay exact on every leaf against a float64 loop.
"""

import warnings

import any_models as am
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import pergrad.stats as ps
from pergrad.loss import per_example_xent
from pergrad.stats import separable, taps
from pergrad.stats.surgery import Unsupported

ALL = ("mean", "sq", "sign", "norms")
BACKENDS = ("surgery", "vmap", "auto", "loop")
V, T, D = am.V, am.T, am.D


class LinenMixer(nn.Module):
  """Embed -> Dense -> a mixing layer -> Dense head."""

  mix: str

  @nn.compact
  def __call__(self, ids):
    h = jnp.tanh(nn.Dense(D, name="up")(nn.Embed(V, D, name="wte")(ids)))
    if self.mix == "center":
      h = h - h.mean(0)
    else:
      h = nn.BatchNorm(use_running_average=False, name="bn")(h)
    return nn.Dense(V, name="head")(h)


class NnxMixer(nnx.Module):
  def __init__(self, rngs):
    self.wte = nnx.Embed(V, D, rngs=rngs)
    self.up = nnx.Linear(D, D, rngs=rngs)
    self.bn = nnx.BatchNorm(D, use_running_average=False, rngs=rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, ids):
    return self.head(self.bn(jnp.tanh(self.up(self.wte(ids)))))


def _linen(mix):
  model = LinenMixer(mix)
  variables = model.init(jax.random.PRNGKey(0), jnp.zeros((2, T), jnp.int32))
  rest = {k: v for k, v in variables.items() if k != "params"}

  def loss_fn(p, b):
    if rest:  # BatchNorm's batch_stats: updated in training mode
      logits = model.apply({"params": p, **rest}, b["inputs"], mutable=list(rest))[0]
    else:
      logits = model.apply({"params": p}, b["inputs"])
    return per_example_xent(logits, b["targets"])
  return loss_fn, variables["params"]


def _nnx():
  graphdef, params, rest = nnx.split(NnxMixer(nnx.Rngs(0)), nnx.Param, ...)
  merged = lambda p: nnx.merge(graphdef, p, rest, copy=True)  # BatchNorm updates its stats
  return (lambda p, b: per_example_xent(merged(p)(b["inputs"]), b["targets"])), params


def _plain_params(seed=0):
  rng = np.random.default_rng(seed)
  w = lambda *s: jnp.asarray(0.3 * rng.standard_normal(s), jnp.float32)
  return {"wte": w(V, D), "up": {"kernel": w(D, D), "bias": w(D)},
          "head": {"kernel": w(D, V), "bias": w(V)}}


def _plain(how):
  """A per-token loss reduced per example: by the batch's mean loss or token count (mixing),
  or by the example's own mask (harmless)."""
  def loss_fn(p, b):
    h = jnp.tanh(taps.dense(taps.embed(b["inputs"], p["wte"]), p["up"]["kernel"],
                            p["up"]["bias"]))
    logits = taps.dense(h, p["head"]["kernel"], p["head"]["bias"])
    xent = jax.nn.logsumexp(logits, -1) - jnp.take_along_axis(
        logits, b["targets"][..., None], -1)[..., 0]
    mask = (b["targets"] != 0).astype(jnp.float32)
    if how == "batch_mean":
      per = xent.mean(-1)
      return per / per.mean()
    if how == "batch_count":
      return (xent * mask).sum(-1) / jnp.maximum(mask.sum(), 1.0)
    return (xent * mask).sum(-1) / jnp.maximum(mask.sum(-1), 1.0)
  return loss_fn, _plain_params()


MIXING = {
    "linen_center": lambda: _linen("center"),
    "linen_batchnorm": lambda: _linen("batchnorm"),
    "nnx_batchnorm": _nnx,
    "plain_batch_mean": lambda: _plain("batch_mean"),
    "plain_batch_count": lambda: _plain("batch_count"),
}


@pytest.mark.parametrize("name", sorted(MIXING))
def test_a_model_that_mixes_examples_is_refused_by_every_backend(name):
  loss_fn, params = MIXING[name]()
  batch = am.batch(4)
  for backend in BACKENDS:
    with warnings.catch_warnings():
      warnings.simplefilter("error")  # auto must not fall back to vmap (a warning)
      with pytest.raises(Unsupported, match="not separable") as e:
        ps.compute(loss_fn, params, batch, want=ALL, backend=backend)
    msg = str(e.value)
    assert "\n" not in msg and "per-example normalization" in msg, msg
    assert "example 0's loss changes when the other examples change: first at" in msg, msg
  # traced (inside jit: seeded stand-ins of the params and the batch), clipped too
  with pytest.raises(Unsupported, match="not separable"):
    jax.eval_shape(lambda p, b: ps.compute(loss_fn, p, b, want=("sq",), per_example_clip=1.0),
                   params, batch)
  # the mean gradient alone is the batch loss's gradient, exact for any model
  _, stats = ps.compute(loss_fn, params, batch)
  want = jax.grad(lambda p: loss_fn(p, batch).mean())(params)
  for g, w in zip(jax.tree.leaves(stats.mean), jax.tree.leaves(want), strict=True):
    np.testing.assert_allclose(g, w, rtol=2e-5, atol=1e-7)


def test_the_refusal_names_the_operation_and_the_line():
  loss_fn, params = _linen("center")
  with pytest.raises(Unsupported) as e:
    ps.compute(loss_fn, params, am.batch(4), want=("sq",))
  assert "reduce_sum at test_stats_separable.py" in str(e.value)
  assert "h = h - h.mean(0)" in str(e.value)


def test_mixing_under_stop_gradient_is_seen():
  def loss_fn(p, b):
    h = jnp.tanh(taps.dense(taps.embed(b["inputs"], p["wte"]), p["up"]["kernel"]))
    h = h - jax.lax.stop_gradient(h.mean(0))
    return per_example_xent(taps.dense(h, p["head"]["kernel"]), b["targets"])
  with pytest.raises(Unsupported, match="not separable"):
    ps.compute(loss_fn, _plain_params(), am.batch(4), want=("sq",), backend="vmap")


def test_one_example_cannot_mix():
  loss_fn, params = _plain("batch_mean")
  separable.check(loss_fn, params, am.batch(1))  # passes: nothing to mix with


def _exact_everywhere(loss_fn, params, batch, want=ALL):
  ref = am.reference64(loss_fn, params, batch, want)
  run = lambda p, b: {be: ps.compute(loss_fn, p, b, want=want, backend=be)[1]
                      for be in ("surgery", "vmap", "auto")}
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # no fallback either
    got = jax.jit(run)(params, batch)
  for be, stats in got.items():
    assert am.mismatches(stats, ref, want) == [], be


def test_an_example_masked_loss_is_exact_on_every_backend():
  _exact_everywhere(*_plain("masked"), am.batch(4))


@pytest.mark.parametrize("kind", ["linen", "nnx", "plain"])
def test_per_example_norms_and_attention_within_an_example_are_separable(kind):
  """(Their statistics match the float64 loop on every backend: tests/test_stats_exact.py,
  tests/test_surgery.py, which now pass through this check too.)"""
  loss_fn, params, _ = am.models(False)[kind]
  separable.check(loss_fn, params, am.batch(5))


@pytest.mark.extended
def test_per_example_layer_norm_model_is_exact_on_every_backend():
  """(sign left out: the key bias's gradient is zero, softmax being shift-invariant)"""
  loss_fn, params, _ = am.models(True)["nnx"]
  _exact_everywhere(loss_fn, params, am.batch(4), want=("mean", "sq", "norms"))


def test_a_loss_that_cannot_run_alone_is_undetermined_not_accepted():
  def loss_fn(p, b):  # a collective over a named axis: runs only inside its shard_map/pmap
    return jax.lax.psum(_plain("masked")[0](p, b), "data")
  with pytest.raises(Unsupported, match="undetermined whether the per-example losses are "
                     "separable: loss_fn did not run on its own at 4 examples"):
    separable.check(loss_fn, _plain_params(), am.batch(4))
