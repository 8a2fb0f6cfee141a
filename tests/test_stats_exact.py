"""Exact or refused: the model patterns on which the surgery backend once returned wrong
statistics silently (issue 37), against a float64 per-example loop (`any_models.reference64`).

Each is refused by surgery with an `Unsupported` naming the leaf and the offending use, and
backend="auto" falls back to vmap (a one-time warning) with exact statistics, clipped
mean included; keyword inputs and taps under `jax.vmap` work or are refused, never crash.
"""

import warnings

import any_models as am
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import pergrad.stats as ps
from pergrad.loss import per_example_xent
from pergrad.stats import api, noise, taps
from pergrad.stats.surgery import Unsupported

ALL = ("mean", "sq", "sign", "norms")
V, T, D = am.V, am.T, am.D


def _dense(rng, *shape):
  return jnp.asarray(0.3 * rng.standard_normal(shape), jnp.float32)


def _plain_params(seed=0):
  rng = np.random.default_rng(seed)
  return {"wte": _dense(rng, V, D), "up": {"kernel": _dense(rng, D, D), "bias": _dense(rng, D)},
          "head": {"kernel": _dense(rng, D, V), "bias": _dense(rng, V)}}


def _raw_tie(p, b):
  """A dense kernel also used directly: logits through x @ Wᵀ (a hand-written tie)."""
  h = jnp.tanh(taps.dense(taps.embed(b["inputs"], p["wte"]), p["up"]["kernel"], p["up"]["bias"]))
  h = h @ p["up"]["kernel"].T
  return per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])


def _penalty(p, b):
  """xent_b + λ‖W‖²: a parameter term inside the per-example loss."""
  h = jnp.tanh(taps.dense(taps.embed(b["inputs"], p["wte"]), p["up"]["kernel"], p["up"]["bias"]))
  xent = per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])
  return xent + 0.05 * jnp.sum(jnp.square(p["up"]["kernel"]))


def _vmapped(n_inside):
  """A per-example model vmapped over the batch, `n_inside` of its taps inside the vmap."""
  def loss_fn(p, b):
    x = taps.embed(b["inputs"], p["wte"])
    up = lambda a: jnp.tanh(taps.dense(a, p["up"]["kernel"], p["up"]["bias"]))
    head = lambda a: taps.dense(a, p["head"]["kernel"], p["head"]["bias"])
    if n_inside == 1:
      logits = head(jax.vmap(up)(x))
    else:
      logits = jax.vmap(lambda a: head(up(a)))(x)
    return per_example_xent(logits, b["targets"])
  return loss_fn


class _KeywordLM(nnx.Module):
  """nnx layers called with a keyword input, lin(inputs=x)."""

  def __init__(self, rngs):
    self.wte = nnx.Embed(V, D, rngs=rngs)
    self.up = nnx.Linear(D, D, rngs=rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, ids):
    return self.head(inputs=jnp.tanh(self.up(inputs=self.wte(ids))))


class _RawTieLM(nnx.Module):
  """NNX: the head's kernel also used as a raw matmul (x @ lin.kernel.T)."""

  def __init__(self, rngs):
    self.wte = nnx.Embed(V, D, rngs=rngs)
    self.up = nnx.Linear(D, D, rngs=rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, ids):
    h = jnp.tanh(self.up(self.wte(ids)))
    return self.head(h + jnp.tanh(h @ self.head.kernel[...]) @ self.head.kernel[...].T)


def _nnx(model):
  graphdef, state = nnx.split(model, nnx.Param)
  state = jax.tree.map(lambda a: a + 0.05, state)
  return (lambda p, b: per_example_xent(nnx.merge(graphdef, p)(b["inputs"]), b["targets"]),
          state)


def _nnx_vmapped():
  """Equinox style: the NNX model applied to one example, jax.vmap-ed over the batch."""
  graphdef, state = nnx.split(_KeywordLM(nnx.Rngs(1)), nnx.Param)
  one = lambda p, ids: nnx.merge(graphdef, p)(ids)
  return (lambda p, b: per_example_xent(jax.vmap(lambda i: one(p, i))(b["inputs"]),
                                        b["targets"]), state)


REFUSED = {  # name -> (loss_fn, params, the Unsupported message's words)
    "raw_tie": (_raw_tie, _plain_params(), "up/kernel"),
    "penalty": (_penalty, _plain_params(), "up/kernel"),
    "vmap_one_tap": (_vmapped(1), _plain_params(), "jax.vmap"),
    "vmap_two_taps": (_vmapped(2), _plain_params(), "jax.vmap"),
    "nnx_raw_tie": (*_nnx(_RawTieLM(nnx.Rngs(0))), "head/kernel"),
    "nnx_vmapped": (*_nnx_vmapped(), "jax.vmap"),
}


def _clip(ref):
  norms = np.sqrt(sum(np.square(g).reshape(g.shape[0], -1).sum(-1)
                      for g in jax.tree.leaves(ref["_samples"])))
  return float(np.median(norms))


# The main suite keeps one case per pattern kind (the fuzzer's main seeds add a penalty and
# a vmapped NNX model); the others run in the extended suite.
EXTENDED = ("penalty", "vmap_one_tap", "nnx_raw_tie")


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.extended] * (n in EXTENDED))
                                  for n in REFUSED])
def test_surgery_refuses_and_auto_falls_back_to_exact_vmap(name):
  loss_fn, params, words = REFUSED[name]
  batch = am.batch(4)
  with pytest.raises(Unsupported, match=words):
    ps.compute(loss_fn, params, batch, want=ALL, backend="surgery")
  ref = am.reference64(loss_fn, params, batch)
  clipped = am.reference64(loss_fn, params, batch, clip=_clip(ref))
  with warnings.catch_warnings(record=True):
    warnings.simplefilter("always")
    _, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL))(params, batch)
    _, cstats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, want=ALL,
                                                per_example_clip=_clip(ref)))(params, batch)
    _, mean = jax.jit(lambda p, b: ps.compute(loss_fn, p, b))(params, batch)
  assert am.mismatches(stats, ref) == []
  assert am.mismatches(cstats, clipped) == []
  assert am.mismatches(mean, ref, want=("mean",)) == []


def test_the_fallback_warns_once_naming_the_leaf_and_the_use(monkeypatch):
  monkeypatch.setattr(api, "_WARNED", set())
  loss_fn, params, _ = REFUSED["penalty"]
  batch = am.batch(3)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(2):  # the fallback is decided while tracing: no need to run it
      jax.eval_shape(lambda p, b: ps.compute(loss_fn, p, b, want=("sq",)), params, batch)
  msgs = [str(w.message) for w in seen if "vmap" in str(w.message)]
  assert len(msgs) == 1, msgs
  assert "up/kernel" in msgs[0] and "falls back to backend='vmap'" in msgs[0]


def test_keyword_inputs_work_in_every_backend():
  loss_fn, params = _nnx(_KeywordLM(nnx.Rngs(0)))
  batch = am.batch(4)
  ref = am.reference64(loss_fn, params, batch)
  for backend in ("surgery", "vmap"):
    _, stats = jax.jit(lambda p, b, be=backend: ps.compute(loss_fn, p, b, want=ALL,
                                                           backend=be))(params, batch)
    assert am.mismatches(stats, ref) == [], backend
  _, mean = ps.compute(loss_fn, params, batch)
  assert am.mismatches(mean, ref, want=("mean",)) == []


@pytest.mark.parametrize("tied", [pytest.param(False, marks=pytest.mark.extended), True])
def test_layers_select_the_same_leaves_under_every_backend(tied):
  """One classifier (the layer call's class, else the name): layers=("norm",) picks the
  norm layers ln1/ln2/ln_f (names that do not say "norm") and ("embedding",) the tables,
  under surgery, vmap and the loop alike, on Linen, NNX and plain JAX."""
  for layers, owners in ((("norm",), {"ln1", "ln2", "ln_f"}),
                         (("embedding",), {"wte"} if tied else {"wte", "wpe"})):
    req = ps.StatsRequest(("norms",), layers=layers)
    for kind in ("linen", "nnx", "plain"):
      loss_fn, params, _ = am.models(tied)[kind]
      paths = noise.leaf_paths(params)
      for backend in ("surgery", "vmap", "loop"):
        _, stats = jax.eval_shape(lambda p, b, f=loss_fn, be=backend, r=req: ps.compute(
            f, p, b, r, backend=be), params, am.batch(2))  # the selection is static
        chosen = {p.split("/")[0] for p in paths if stats.selects(p)}
        assert chosen == owners, (layers, kind, backend, chosen)


def _jitted_block(p, b):
  """A layer call inside an inner jax.jit that closes over its parameters (the proof
  follows the jit's sub-jaxpr)."""
  block = jax.jit(lambda x: jnp.tanh(taps.dense(x, p["up"]["kernel"], p["up"]["bias"])))
  h = block(taps.embed(b["inputs"], p["wte"]))
  return per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])


def _jitted_arguments(p, b):
  """The same with the parameters passed to the jit: inside it they are not the leaves."""
  block = jax.jit(lambda q, x: jnp.tanh(taps.dense(x, q["kernel"], q["bias"])))
  h = block(p["up"], taps.embed(b["inputs"], p["wte"]))
  return per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])


def test_layer_calls_inside_an_inner_jit_are_exact_or_refused():
  params, batch = _plain_params(), am.batch(4)
  with pytest.raises(Unsupported, match="not a leaf of params"):
    ps.compute(_jitted_arguments, params, batch, want=ALL, backend="surgery")
  ref = am.reference64(_jitted_block, params, batch)
  C = _clip(ref)
  for clip, r in ((None, ref), (C, am.reference64(_jitted_block, params, batch, clip=C))):
    _, stats = jax.jit(lambda p, b, c=clip: ps.compute(
        _jitted_block, p, b, want=ALL, backend="surgery", per_example_clip=c))(params, batch)
    assert am.mismatches(stats, r) == [], clip
