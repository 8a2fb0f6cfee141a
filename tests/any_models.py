"""One small transformer LM written three ways (Flax Linen, Flax NNX, plain JAX with
`pergrad.stats.taps`) with the same parameter names and the same arithmetic, so that the
three give the same statistics on the same parameters.

Layers: token table `wte`, learned positions `wpe` (untied) , pre-norm block (ln1, causal
attention query/key/value/out, ln2, MLP up/down), final norm ln_f, output `head` (untied)
or `wte.attend` (tied). LayerNorm with biases (untied) or RMSNorm (tied). The norms are
named ln1/ln2 on purpose: names alone (`pergrad.layer_types`) do not call them "norm".
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from pergrad.loss import per_example_xent
from pergrad.stats import taps

V, T, D, H, F = 11, 5, 8, 2, 12
EPS = 1e-6
DENSE = ("query", "key", "value", "out", "up", "down")


def _attention(q, k, v):
  B = q.shape[0]
  split = lambda a: a.reshape(B, T, H, D // H)
  logits = jnp.einsum("bthd,bshd->bhts", split(q), split(k)) / np.sqrt(D // H)
  logits = jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -1e9)
  return jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits), split(v)).reshape(B, T, D)


def _body(x, norm, dense):
  """The block and final norm, given norm(name, x) and dense(name, x)."""
  h = norm("ln1", x)
  x = x + dense("out", _attention(dense("query", h), dense("key", h), dense("value", h)))
  x = x + dense("down", jax.nn.gelu(dense("up", norm("ln2", x))))
  return norm("ln_f", x)


class LinenLM(nn.Module):
  tied: bool = False

  @nn.compact
  def __call__(self, ids):
    wte = nn.Embed(V, D, name="wte")
    x = wte(ids)
    if not self.tied:
      x = x + nn.Embed(T, D, name="wpe")(jnp.arange(T))
    Norm = nn.RMSNorm if self.tied else nn.LayerNorm
    sizes = dict(up=F)
    h = _body(x, lambda n, a: Norm(epsilon=EPS, name=n)(a),
              lambda n, a: nn.Dense(sizes.get(n, D), name=n)(a))
    return wte.attend(h) if self.tied else nn.Dense(V, name="head")(h)


class NnxLM(nnx.Module):
  def __init__(self, tied: bool, rngs: nnx.Rngs):
    self.tied = tied
    self.wte = nnx.Embed(V, D, rngs=rngs)
    if not tied:
      self.wpe = nnx.Embed(T, D, rngs=rngs)
      self.head = nnx.Linear(D, V, rngs=rngs)
    Norm = nnx.RMSNorm if tied else nnx.LayerNorm
    for n in ("ln1", "ln2", "ln_f"):
      setattr(self, n, Norm(D, epsilon=EPS, rngs=rngs))
    for n in DENSE:
      setattr(self, n, nnx.Linear(F if n == "down" else D, F if n == "up" else D, rngs=rngs))

  def __call__(self, ids):
    x = self.wte(ids)
    if not self.tied:
      x = x + self.wpe(jnp.arange(T))
    h = _body(x, lambda n, a: getattr(self, n)(a), lambda n, a: getattr(self, n)(a))
    return self.wte.attend(h) if self.tied else self.head(h)


def plain_lm(params, ids, tied: bool = False):
  """The same model as a function of a params dict, its layers through `taps`."""
  p = params
  x = taps.embed(ids, p["wte"]["embedding"])
  if not tied:
    x = x + taps.embed(jnp.arange(T), p["wpe"]["embedding"])

  def norm(n, a):
    if tied:
      return taps.rms_norm(a, p[n]["scale"], eps=EPS)
    return taps.layer_norm(a, p[n]["scale"], p[n]["bias"], eps=EPS)

  dense = lambda n, a: taps.dense(a, p[n]["kernel"], p[n]["bias"])
  h = _body(x, norm, dense)
  return taps.attend(h, p["wte"]["embedding"]) if tied else dense("head", h)


@functools.lru_cache(maxsize=None)
def models(tied: bool):
  """{kind: (loss_fn, params)} for kind in linen, nnx, plain, on the same parameters
  (Linen's init with non-zero biases and norm offsets)."""
  linen = LinenLM(tied)
  params = linen.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda a: a + 0.1 * rng.standard_normal(a.shape, np.float32), params)
  model = NnxLM(tied, nnx.Rngs(0))
  graphdef, state = nnx.split(model, nnx.Param)
  nnx.replace_by_pure_dict(state, jax.tree.map(jnp.asarray, params))

  def nnx_loss(p, b):
    return per_example_xent(nnx.merge(graphdef, p)(b["inputs"]), b["targets"])

  return {
      "linen": (lambda p, b: per_example_xent(linen.apply({"params": p}, b["inputs"]),
                                              b["targets"]), params, linen),
      "nnx": (nnx_loss, state, None),
      "plain": (lambda p, b: per_example_xent(plain_lm(p, b["inputs"], tied), b["targets"]),
                params, None),
  }


def batch(B: int, seed: int = 0):
  rng = np.random.default_rng(seed)
  return {"inputs": jnp.asarray(rng.integers(0, 6, (B, T)), jnp.int32),  # repeated ids
          "targets": jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)}
