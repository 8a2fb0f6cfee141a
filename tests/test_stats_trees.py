"""Statistics of the tree as passed, refusals that name their cause, vmap's precondition.

Parity with the float64 per-example loop (`any_models.reference64`; for a loss whose
examples alone are not its rows, `batch_reference64`, the gradients of the batch's own
per-example losses) on every leaf, on every backend that accepts the model.
"""

from __future__ import annotations

import itertools
import sys
import warnings
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import any_models as am  # noqa: E402

import pergrad.stats as ps  # noqa: E402
from pergrad.loss import per_example_xent  # noqa: E402
from pergrad.stats.alone import check_alone  # noqa: E402
from pergrad.stats.surgery import Unsupported  # noqa: E402

V, T, D, B = 11, 5, 8, 3
ALL = ("mean", "sq", "sign", "norms")
BACKENDS = ("auto", "surgery", "vmap", "loop")
# XLA:CPU options that compile ~the same program several times faster (its speed is moot).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


class _LM(nn.Module):
  """Embedding, LayerNorm, MLP, head; `drop`: a dropout mask drawn for the whole batch
  from one fixed key (float32 draws: the same mask in the float64 reference)."""
  drop: bool = False

  @nn.compact
  def __call__(self, ids):
    x = nn.LayerNorm(name="ln")(nn.Embed(V, D, name="emb")(ids))
    x = jnp.tanh(nn.Dense(D, name="mlp")(x))
    if self.drop:
      keep = jax.random.bernoulli(jax.random.key(3), jnp.float32(0.5), x.shape)
      x = jnp.where(keep, x / 0.5, 0.0)
    return nn.Dense(V, name="head")(x)


class _Shared(nn.Module):
  @nn.compact
  def __call__(self, ids):
    dense = nn.Dense(D, name="mlp")
    x = jnp.tanh(dense(jnp.tanh(dense(nn.Embed(V, D, name="emb")(ids)))))  # called twice
    return nn.Dense(V, name="head")(x)


def _params(module, seed=0):
  rng = np.random.default_rng(seed)
  params = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, T), jnp.int32))["params"]
  return jax.tree.map(lambda a: a + 0.1 * rng.standard_normal(a.shape).astype(np.float32), params)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32),
          "targets": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)}


def _loss(module, params_of=lambda p: p):
  return lambda p, b: per_example_xent(module.apply({"params": params_of(p)}, b["inputs"]),
                                       b["targets"])


def _trees():
  """{case: (loss_fn, params)}: the ways people pass params."""
  lm, params = _LM(), _params(_LM())
  backbone = {k: v for k, v in params.items() if k != "head"}
  teacher = jax.tree.map(lambda a: 0.9 * a, params)

  def distilled(p, b):  # a closed-over teacher of the student's class
    s, t = lm.apply({"params": p}, b["inputs"]), lm.apply({"params": teacher}, b["inputs"])
    kl = (jax.nn.softmax(t) * (jax.nn.log_softmax(t) - jax.nn.log_softmax(s))).sum(-1)
    return per_example_xent(s, b["targets"]) + kl.mean(-1)

  unused = jnp.arange(4.0)
  return {
      "nested": (_loss(lm, lambda q: q["model"]), {"model": params, "extra": unused}),
      "frozen_backbone": (_loss(lm, lambda hp: {**backbone, "head": hp}), params["head"]),
      "unused_leaf": (_loss(lm, lambda q: {k: v for k, v in q.items() if k != "extra"}),
                      {**params, "extra": unused}),
      "teacher": (distilled, params),
  }


def _every_backend(loss_fn, params, batch, backends, clip=None):
  def run(p, b):
    out = {be: ps.compute(loss_fn, p, b, want=ALL, backend=be)[1] for be in backends}
    if clip is not None:
      out["auto/clip"] = ps.compute(loss_fn, p, b, want=ALL, per_example_clip=clip)[1]
    return out
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    out = jax.jit(run).lower(params, batch).compile(FAST_COMPILE)(params, batch)
  assert not [w for w in caught if "falls back" in str(w.message)]  # auto takes surgery
  return out


def _clip(ref) -> float:
  norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1)
                      for g in jax.tree.leaves(ref["_samples"])))
  return float(np.median(norms))


@pytest.mark.parametrize("case", ["nested", "frozen_backbone", "teacher", pytest.param(
    "unused_leaf", marks=pytest.mark.extended)])  # main suite: `test_an_unused_leaf_is_...`
@pytest.mark.parametrize("backends", [("auto", "vmap"), pytest.param(
    ("surgery", "loop"), marks=pytest.mark.extended)])  # auto is surgery here: no warning
def test_params_as_passed_give_the_loops_statistics_on_every_backend(case, backends):
  loss_fn, params = _trees()[case]
  batch = _batch()
  ref = am.reference64(loss_fn, params, batch)
  C = _clip(ref)
  got = _every_backend(loss_fn, params, batch, backends, clip=C)
  for be, stats in got.items():
    expected = am.statistics64(ref["_samples"], clip=C) if be == "auto/clip" else ref
    assert am.mismatches(stats, expected) == [], be
  if isinstance(params, dict) and "extra" in params:  # never reached: zero statistics
    for be, name in itertools.product(got, ALL):
      assert not np.any(np.asarray(got[be].get(name)["extra"])), be


def test_shared_weights_are_refused_as_such():
  loss_fn, params = _loss(_Shared()), _params(_Shared())
  with pytest.raises(Unsupported, match=r"'mlp' is used 2 times.*one Dense layer called more "
                     r"than once on the same parameter arrays \(shared weights\)"):
    ps.compute(loss_fn, params, _batch(), want=ALL, backend="surgery")


def test_a_second_model_made_from_the_leaves_is_refused_as_such():
  """A teacher of the student's class on stop_gradient(params) (self-distillation): its
  parameters are computed inside loss_fn, not leaves; a closed-over teacher is exact
  (`test_params_as_passed_...['teacher']`)."""
  lm = _LM()

  def self_distilled(p, b):
    s = lm.apply({"params": p}, b["inputs"])
    t = lm.apply({"params": jax.lax.stop_gradient(p)}, b["inputs"])
    return per_example_xent(s, b["targets"]) + (jax.nn.softmax(t) * -jax.nn.log_softmax(s)).sum(
        -1).mean(-1)

  with pytest.raises(Unsupported, match=r"the embedding of the Embed call at 'emb' is not a "
                     r"leaf of params.*a second model's parameters made from the leaves"):
    ps.compute(self_distilled, _params(lm), _batch(), want=ALL, backend="surgery")


def test_an_unused_leaf_is_no_refusal():
  """A top-level leaf the loss never reaches (it read 'cannot handle _LM at ''')."""
  loss_fn, params = _trees()["unused_leaf"]
  _, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL, backend="surgery"))(
      params, _batch())
  assert not np.any(np.asarray(stats.get("sq")["extra"]))
  assert float(np.asarray(stats.get("sq")["mlp"]["kernel"]).sum()) > 0


def _size_mean(p, b):
  """A hand-written mean over the batch: each example alone is B times its row."""
  logits = _LM().apply({"params": p}, b["inputs"])
  tok = -jnp.take_along_axis(jax.nn.log_softmax(logits), b["targets"][..., None], -1)[..., 0]
  return tok.sum(-1) / b["inputs"].shape[0]


@pytest.mark.parametrize("case,cause", [("batch_size", "depends on the batch's size"),
                                        ("dropout", "draws random numbers per batch")])
def test_vmap_refuses_a_loss_whose_examples_alone_are_not_its_rows(case, cause):
  loss_fn = _size_mean if case == "batch_size" else _loss(_LM(drop=True))
  params, batch = _params(_LM()), _batch()
  for be in ("vmap", "loop"):
    with pytest.raises(Unsupported, match=cause + r".*divide by a constant.*fold_in"):
      jax.eval_shape(lambda p, b, be=be: ps.compute(loss_fn, p, b, want=ALL, backend=be),
                     params, batch)
  ref = am.batch_reference64(loss_fn, params, batch)
  stats = _every_backend(loss_fn, params, batch, ("auto",))["auto"]  # surgery: no warning
  assert am.mismatches(stats, ref) == []


def test_linen_dropout_with_one_rng_is_refused_on_vmap():
  class Dropped(nn.Module):
    @nn.compact
    def __call__(self, ids):
      x = nn.Dropout(0.1, deterministic=False)(nn.Embed(V, D)(ids), rng=jax.random.key(0))
      return nn.Dense(V)(x)
  loss_fn, params = _loss(Dropped()), _params(Dropped())
  with pytest.raises(Unsupported, match="draws random numbers per batch"):
    ps.compute(loss_fn, params, _batch(), want=("sq",), backend="vmap")


def test_randomness_drawn_per_example_from_the_batch_passes_vmaps_check():
  """The fix the refusal gives: one key per example, made outside loss_fn, in the batch."""
  lm = _LM()

  def loss_fn(p, b):
    h = lm.apply({"params": p}, b["inputs"])
    keep = jax.vmap(lambda k: jax.random.bernoulli(jax.random.wrap_key_data(k), 0.5,
                                                    h.shape[1:]))(b["keys"])
    return per_example_xent(jnp.where(keep, h, 0.0), b["targets"])

  batch = {**_batch(), "keys": jax.random.key_data(jax.random.split(jax.random.key(0), B))}
  check_alone(loss_fn, _params(lm), batch)  # no refusal


def test_auto_refuses_when_surgery_and_vmap_both_do():
  """Shared weights (surgery refuses) and a loss divided by the batch's size (vmap
  refuses): one line naming both causes, not vmap's wrong statistics."""
  shared = _Shared()

  def loss_fn(p, b):
    return _loss(shared)(p, b) / b["inputs"].shape[0]

  with pytest.raises(Unsupported, match=r"no backend is exact.*shared weights.*depends on the "
                     r"batch's size"):
    ps.compute(loss_fn, _params(shared), _batch(), want=ALL)


def test_vmaps_check_passes_a_model_in_lower_precision():
  """The tolerance follows the least precise float of the loss (bfloat16 activations)."""
  class Low(nn.Module):
    @nn.compact
    def __call__(self, ids):
      x = jnp.tanh(nn.Dense(16, dtype=jnp.bfloat16)(nn.Embed(V, D)(ids)))
      return nn.Dense(V, dtype=jnp.bfloat16)(x).astype(jnp.float32)
  loss_fn, params, batch = _loss(Low()), _params(Low()), _batch()
  check_alone(loss_fn, params, batch)  # no refusal


def test_the_per_leaf_fallback_checks_that_examples_alone_are_their_rows():
  """surgery_vmap runs the refused leaves' examples alone: with one leaf refused (a penalty
  on it) and a loss divided by the batch's size, it refuses, and auto refuses naming both
  causes on every platform (not the fallback's wrong statistics); params given as shapes
  alone (training decides so) too."""
  def loss_fn(p, b):
    return _size_mean(p, b) + 0.01 * jnp.sum(jnp.square(p["mlp"]["kernel"]))

  params, batch = _params(_LM()), _batch()
  with pytest.raises(Unsupported, match=r"surgery_vmap.*not the same alone.*divide by a "
                     r"constant"):
    jax.eval_shape(lambda p, b: ps.compute(loss_fn, p, b, want=ALL, backend="surgery_vmap"),
                   params, batch)
  for platform in ("cpu", "gpu"):  # auto's fallback: vmap (or surgery_vmap off CPU)
    with pytest.raises(Unsupported, match=r"no backend is exact.*'mlp/kernel'.*not the same "
                       r"alone"):
      ps.decide(loss_fn, params, batch, ps.StatsRequest(want=ALL), "auto", platform)
  shapes = lambda t: jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), t)
  with pytest.raises(Unsupported, match=r"no backend is exact.*not the same alone"):
    ps.decide(loss_fn, shapes(params), shapes(batch), ps.StatsRequest(want=("sq",)))
