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


class NnxResidualBlock(nnx.Module):
  """x + tanh(W LN(x) + b) at width `d`: the block the scanned NNX test models stack."""

  def __init__(self, d: int, rngs: nnx.Rngs):
    self.ln = nnx.LayerNorm(d, rngs=rngs)
    self.lin = nnx.Linear(d, d, rngs=rngs)

  def __call__(self, x):
    return x + jnp.tanh(self.lin(self.ln(x)))


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


# --- a float64 per-example loop: the reference of every statistic ----------------------------
def reference64(loss_fn, params, batch, want=("mean", "sq", "sign", "norms"), clip=None):
  """{statistic: tree like params} of the per-example gradients, by a float64 Python loop:
  g_b = ∇ loss_b (batch of one), clipped to ĝ_b = g_b·min(1, C/‖g_b‖) when `clip` is C;
  "mean": Σ_b ĝ_b, "sq": Σ_b ĝ_b², "sign": Σ_b sign(ĝ_b), "norms": [‖ĝ_b‖² per leaf]
  (leaves (B,)), and "_samples": the ĝ_b stacked (leaves (B, ...))."""
  with jax.enable_x64(True):
    wide = lambda a: (np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype,
                                                                   np.floating) else a)
    p64 = jax.tree.map(wide, params)
    grad = jax.jit(jax.grad(lambda p, ex: loss_fn(p, ex)[0].astype(jnp.float64)))
    B = jax.tree.leaves(batch)[0].shape[0]
    batch = jax.tree.map(np.asarray, batch)  # slices in NumPy: no eager op to compile
    samples = [jax.tree.map(np.asarray, grad(p64, jax.tree.map(lambda x, b=b: x[b:b + 1], batch)))
               for b in range(B)]
  return statistics64(jax.tree.map(lambda *g: np.stack(g), *samples), want, clip)


def batch_reference64(loss_fn, params, batch, want=("mean", "sq", "sign", "norms"), clip=None):
  """`reference64` of the batch's own per-example losses: g_b = ∇ loss_fn(θ, batch)[b], a
  float64 loop over b of the gradient of row b with the whole batch in (the same as
  reference64's batches of one where each example's loss alone is its row; else the
  statistics every backend must give or refuse)."""
  with jax.enable_x64(True):
    wide = lambda a: (np.asarray(a, np.float64) if np.issubdtype(np.asarray(a).dtype,
                                                                   np.floating) else a)
    p64 = jax.tree.map(wide, params)
    grad = jax.jit(jax.grad(lambda p, b: loss_fn(p, batch)[b].astype(jnp.float64)))
    B = jax.tree.leaves(batch)[0].shape[0]
    samples = [jax.tree.map(np.asarray, grad(p64, b)) for b in range(B)]
  return statistics64(jax.tree.map(lambda *g: np.stack(g), *samples), want, clip)


def statistics64(samples, want=("mean", "sq", "sign", "norms"), clip=None):
  """`reference64`'s statistics of float64 per-example gradients (leaves (B, ...))."""
  B = jax.tree.leaves(samples)[0].shape[0]
  if clip is not None:
    norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1) for g in jax.tree.leaves(samples)))
    w = np.minimum(1.0, clip / np.maximum(norms, 1e-300))
    samples = jax.tree.map(lambda g: g * w.reshape((B,) + (1,) * (g.ndim - 1)), samples)
  stacked = samples
  out = {"_samples": stacked, "mean": jax.tree.map(lambda g: g.sum(0), stacked)}
  if "sq" in want:
    out["sq"] = jax.tree.map(lambda g: np.square(g).sum(0), stacked)
  if "sign" in want:
    out["sign"] = jax.tree.map(lambda g: np.sign(g).sum(0), stacked)
  if "norms" in want:
    out["norms"] = jax.tree.map(lambda g: np.square(g).reshape(B, -1).sum(-1), stacked)
  return out


# A float32 value reached through k roundings is off by at most γ_k ≈ k·u of the magnitudes
# summed (u = 2⁻²⁴; Higham, Accuracy and Stability, §3.1). k = 32 bounds the roundings along one
# g_b's path in the fuzzed models (≤ 3 blocks, contractions of ≤ 7 terms, the loss normaliser);
# the worst measured over seeds 0-249's models that mix examples (ḡ = 0) is 6.0·u·S (seed 185).
ROUNDINGS = 32


def mismatches(stats, ref, want=("mean", "sq", "sign", "norms"), rtol=3e-4) -> list[str]:
  """The (statistic, leaf) pairs where `stats` (a GradStats) differs from `reference64`'s
  `ref` by more than float32 round-off: ‖got − ref‖ > rtol·(‖ref‖ + 1e-3·the largest leaf's
  ‖ref‖) per leaf, plus for the mean ROUNDINGS·u·S, S the largest leaf's Σ_b ‖g_b‖ (a sum's
  round-off scales with its summands, not with ‖ḡ‖: a loss normalised by the batch's mean
  loss has ḡ = 0 exactly); signs only where no sample is near zero. [] when they all agree."""
  bad = []
  samples = ref["_samples"]
  summands = max(float(np.linalg.norm(np.reshape(x, (len(x), -1)), axis=1).sum())
                 for x in jax.tree.leaves(samples))  # the largest leaf's Σ_b ‖g_b‖
  paths = [jax.tree_util.keystr(k, simple=True, separator="/")
           for k, _ in jax.tree_util.tree_flatten_with_path(samples)[0]]
  for name in want:
    got = [np.asarray(x, np.float64) for x in jax.tree.leaves(jax.device_get(stats.get(name)))]
    exp = jax.tree.leaves(ref[name])
    if len(got) != len(exp):
      return [f"{name}: {len(got)} leaves, expected {len(exp)}"]
    top = max(float(np.linalg.norm(e)) for e in exp)
    floor = ROUNDINGS * 2.0**-24 * summands if name == "mean" else 0.0
    for path, g, e, s in zip(paths, got, exp, jax.tree.leaves(samples), strict=True):
      if name == "sign":
        a = np.abs(s)
        ok = np.all(a > 1e-4 * max(float(a.max()), 1e-30), axis=0)
        g, e = np.where(ok, g, 0), np.where(ok, e, 0)
        err, tol = float(np.abs(g - e).max(initial=0.0)), 1e-3
      else:
        err = float(np.linalg.norm(g - e))
        tol = rtol * (float(np.linalg.norm(e)) + 1e-3 * top) + floor
      if not err <= tol:
        bad.append(f"{name} {path}: error {err:.3g} > {tol:.3g}")
  return bad
