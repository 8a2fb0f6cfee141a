"""The differential fuzzer's model generator and check (tests/test_stats_fuzz.py runs them):
`draw(seed)` describes a small random model (frontend, token axis, blocks, head, hazard,
mixing), `build(seed)` makes it, `check(seed)` compares every backend with a float64
per-example loop (`any_models.reference64`): see tests/test_stats_fuzz.py's docstring.
"""

from __future__ import annotations

import functools
import inspect
import sys
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
import fuzz_scan  # noqa: E402
from fuzz_trees import as_passed  # noqa: E402

from pergrad.loss import per_example_xent  # noqa: E402
from pergrad.stats import taps  # noqa: E402

B, T, D, F0, V = 3, 3, 4, 5, 7
ALL = ("mean", "sq", "sign", "norms")
# Hazards surgery cannot prove exact (refused) and those it must accept.
REFUSED = ("penalty", "shared", "vmapped", "raw_tie")
HAZARDS = ("none", "none", "penalty", "shared", "vmapped", "scan", "remat", "keyword")
# Ways to mix examples (refused by every backend as not separable), drawn apart from the
# hazards (their own stream, 1 model in 6): the earlier seeds keep their models otherwise.
MIXING = ("center", "sort", "cumsum", "loss_mean", "token_count")
# How params is passed (own stream, 1 model in 3): nested under a key; only the output layer's
# leaves, the rest frozen constants closed over (not beside nnx.scan: NNX refuses); extra leaves.
TREES = ("nested", "frozen", "extra")
# Losses whose per-example losses alone are not the batch's rows (their own stream, 1 model
# in 6 of those that do not mix examples): divided by the batch's size; a dropout mask drawn
# for the batch with one fixed key. vmap and the loop must refuse them; surgery is exact.
PER_BATCH = ("batch_size", "dropout")
# Tables on ids without the example axis (own stream, 1 model in 4): "positions" (added to h),
# "alibi" ([D, 1] on arange(D), sliced to [D], scales h), "relative" (T5-style: [2T-1, 1] on [T,
# T] relative positions; "positions" without tokens): surgery refuses those two, auto serves them.
TABLES = ("positions", "alibi", "relative")


def draw(seed: int) -> dict:
  """The random model's description (module docstring)."""
  rng = np.random.default_rng(seed)
  frontend = str(rng.choice(["plain", "nnx", "linen"]))
  tokens = bool(rng.integers(2))
  blocks = []
  for _ in range(int(rng.integers(1, 4))):
    kind = str(rng.choice(["dense", "general", "einsum", "norm"]))
    if kind == "einsum" and frontend != "nnx":
      kind = "dense"
    norm = (str(rng.choice(["layer", "rms"])), bool(rng.integers(2)), bool(rng.integers(2)))
    blocks.append((kind, norm if kind == "norm" else None))
  head = str(rng.choice(["dense", "attend", "raw_tie"])) if tokens else "dense"
  hazard = str(rng.choice(HAZARDS))
  if hazard in ("vmapped", "remat") and frontend == "linen":
    hazard = "none"  # not fuzzed: Linen's nn.vmap, a remat body outside a scan (`fuzz_scan`)
  remat = bool(hazard == "scan" and np.random.default_rng(seed + 70_000).random() < 1 / 2)
  if hazard == "keyword" and frontend == "plain":
    hazard = "none"
  mix = np.random.default_rng(seed + 20_000)
  mixing = str(mix.choice(MIXING)) if mix.random() < 1 / 6 else None
  how = np.random.default_rng(seed + 30_000)
  tree = str(how.choice(TREES)) if how.random() < 1 / 3 else "as_is"
  if tree == "frozen" and frontend == "nnx" and hazard == "scan":
    tree = "as_is"  # NNX: "Cannot extract graph node from different trace level"
  per_batch = str(how.choice(PER_BATCH)) if how.random() < 1 / 6 and not mixing else None
  tab = np.random.default_rng(seed + 50_000)
  table = str(tab.choice(TABLES)) if tab.random() < 1 / 4 else None
  table = "positions" if table == "relative" and not tokens else table
  # NNX as NNX users write it, 1 model in 2 of NNX's passed as they are: the module itself
  # passed as params, loss_fn(model, batch) (the engine splits and merges it).
  module = (frontend == "nnx" and tree == "as_is"
            and np.random.default_rng(seed + 60_000).random() < 1 / 2)
  return dict(seed=seed, frontend=frontend, tokens=tokens, blocks=blocks, head=head,
              hazard=hazard, scan_remat=remat, mixing=mixing, tree=tree, per_batch=per_batch,
              table=table, module=module)


def _has_params(block) -> bool:
  kind, norm = block
  return kind != "norm" or norm[1] or (norm[0] == "layer" and norm[2])


def refused(m: dict) -> bool:
  """Whether surgery must refuse the model (a vmapped body refused only where a layer call
  in it owns parameters: a body of parameter-free norms is exact; scan and remat: exact)."""
  if m.get("mixing"):
    return True
  if m.get("tree") == "frozen":  # the frozen layers are constants: no hazard in them counts
    return m["head"] == "raw_tie" or m["hazard"] == "penalty"
  if m.get("table") in ("alibi", "relative"):
    return True
  if m["hazard"] == "vmapped":
    return any(_has_params(b) for b in m["blocks"]) or m["head"] in REFUSED
  return m["hazard"] in REFUSED or m["head"] in REFUSED


def _body(m, ops, h):
  """The blocks on h (…×D), through the frontend's `ops`."""
  for i, (kind, _) in enumerate(m["blocks"]):
    h = getattr(ops, kind)(i, h)
    if kind != "norm":
      h = jnp.tanh(h)
  if m["hazard"] == "shared":
    h = jnp.tanh(ops.dense("shared", jnp.tanh(ops.dense("shared", h))))
  if m["hazard"] == "scan":
    h = ops.scan(h)
  return h


def _dropout(h):
  """A dropout mask for the whole batch from one fixed key (float32 draws, x64 or not)."""
  keep = jax.random.bernoulli(jax.random.key(7), jnp.float32(0.75), h.shape)
  return jnp.where(keep, h / 0.75, 0.0).astype(h.dtype)


def _forward(m, ops, x):
  h = ops.embed(x) if m["tokens"] else ops.dense("in", x)
  if m.get("table") == "positions":  # [T, D] on arange(T), or [D] on a scalar id
    h = h + ops.lookup(jnp.arange(T) if m["tokens"] else jnp.ones((), jnp.int32))
  elif m.get("table") == "alibi":  # [D, 1] on arange(D), sliced: no broadcast of its own
    h = h * ops.lookup(jnp.arange(D))[:, 0]
  elif m.get("table") == "relative":  # [T, T] ids: a bias over h's tokens, per example
    rel = jnp.arange(T)[:, None] - jnp.arange(T)[None, :] + T - 1
    h = h + jnp.einsum("ts,bsd->btd", ops.lookup(rel)[..., 0], h)
  if m.get("per_batch") == "dropout":
    h = _dropout(h)
  mixed = {"center": lambda a: a - a.mean(0), "sort": lambda a: jnp.sort(a, axis=0),
           "cumsum": lambda a: jnp.cumsum(a, axis=0)}.get(m.get("mixing"), lambda a: a)
  h = mixed(h)  # over the example axis, outside any per-example vmap
  if m["hazard"] == "vmapped":
    h = jax.vmap(lambda a: _body(m, ops, a))(h)
  elif m["hazard"] == "remat":
    h = jax.checkpoint(lambda a: _body(m, ops, a))(h)
  else:
    h = _body(m, ops, h)
  if m["head"] == "attend":
    return ops.attend(h)
  if m["head"] == "raw_tie":
    return h @ ops.table().T
  return ops.dense("head", h)


def _out(name):
  return V if name == "head" else D


def _in(name):
  return F0 if name == "in" else D


def _table_shape(m):
  """(rows, width) of the fuzzed table (`TABLES`)."""
  return {"positions": (T if m["tokens"] else 2, D), "alibi": (D, 1),
          "relative": (2 * T - 1, 1)}[m["table"]]


def _keyword(layer, h):
  """layer(inputs=h), by the name of the layer's input argument (inputs, x)."""
  call = type(layer).__call__
  name = list(inspect.signature(getattr(call, "__wrapped__", call)).parameters)[1]
  return layer(**{name: h})


class _Plain:
  """Plain JAX through `taps`: params {name: {...}}."""

  def __init__(self, m, p):
    self.m, self.p = m, p

  def embed(self, ids):
    return taps.embed(ids, self.p["wte"]["embedding"])

  def lookup(self, ids):
    return taps.embed(ids, self.p["tab"]["embedding"])

  def table(self):
    return self.p["wte"]["embedding"]

  def attend(self, h):
    return taps.attend(h, self.p["wte"]["embedding"])

  def dense(self, i, h):
    q = self.p[f"d{i}"]
    return taps.dense(h, q["kernel"], q["bias"])

  def general(self, i, h):
    q = self.p[f"d{i}"]
    return taps.dense(h.reshape(h.shape[:-1] + (2, D // 2)), q["kernel"], q["bias"], axes=2)

  def norm(self, i, h):
    q, (variant, _, _) = self.p[f"d{i}"], self.m["blocks"][i][1]
    if variant == "rms":
      return taps.rms_norm(h, q.get("scale"))
    return taps.layer_norm(h, q.get("scale"), q.get("bias"))

  def scan(self, h):
    return fuzz_scan.plain(self.p["stack"], h, self.m["scan_remat"])


def _plain_params(m, rng):
  w = lambda *s: np.zeros(s, np.float32)  # values: `build`
  p = {"wte": {"embedding": w(V, D)}} if m["tokens"] or m["head"] != "dense" else {}
  names = [("in", "dense")] * (not m["tokens"]) + [(i, k) for i, (k, _) in enumerate(m["blocks"])]
  names += [("shared", "dense")] * (m["hazard"] == "shared") + [("head", "dense")] * (
      m["head"] == "dense")
  for name, kind in names:
    key = f"d{name}"
    if kind == "norm":
      _, scale, bias = m["blocks"][name][1]
      variant = m["blocks"][name][1][0]
      p[key] = {**({"scale": w(D)} if scale else {}),
                **({"bias": w(D)} if bias and variant == "layer" else {})}
    elif kind == "general":
      p[key] = {"kernel": w(2, D // 2, D), "bias": w(D)}
    else:
      p[key] = {"kernel": w(_in(name), _out(name)), "bias": w(_out(name))}
  if m["hazard"] == "scan":
    p["stack"] = {"kernel": w(2, D, D), "bias": w(2, D)}
  if m.get("table"):
    p["tab"] = {"embedding": w(*_table_shape(m))}
  return p


class _NnxOps:
  def __init__(self, mod):
    self.mod = mod

  def _call(self, layer, h):
    return _keyword(layer, h) if self.mod.m["hazard"] == "keyword" else layer(h)

  def embed(self, ids):
    return self.mod.wte(ids)

  def lookup(self, ids):
    return self.mod.tab(ids)

  def table(self):
    return self.mod.wte.embedding[...]

  def attend(self, h):
    return self.mod.wte.attend(h)

  def dense(self, i, h):
    return self._call(getattr(self.mod, f"d{i}"), h)

  def einsum(self, i, h):
    return self._call(getattr(self.mod, f"d{i}"), h)

  def general(self, i, h):
    return self._call(getattr(self.mod, f"d{i}"), h.reshape(h.shape[:-1] + (2, D // 2)))

  def norm(self, i, h):
    return self._call(getattr(self.mod, f"d{i}"), h)

  def scan(self, h):
    return fuzz_scan.nnx_scan(self.mod.stack, h, self.mod.m["scan_remat"])


class _NnxModel(nnx.Module):
  def __init__(self, m, rngs):
    self.m = m
    if m["tokens"] or m["head"] != "dense":
      self.wte = nnx.Embed(V, D, rngs=rngs)
    if m.get("table"):
      self.tab = nnx.Embed(*_table_shape(m), rngs=rngs)
    names = ["in"] * (not m["tokens"]) + ["shared"] * (m["hazard"] == "shared") + [
        "head"] * (m["head"] == "dense")
    for name in names:
      setattr(self, f"d{name}", nnx.Linear(_in(name), _out(name), rngs=rngs))
    if m["hazard"] == "scan":
      self.stack = fuzz_scan.nnx_stack(D, rngs)
    for i, (kind, norm) in enumerate(m["blocks"]):
      if kind == "norm":
        variant, scale, bias = norm
        layer = (nnx.RMSNorm(D, use_scale=scale, rngs=rngs) if variant == "rms" else
                 nnx.LayerNorm(D, use_scale=scale, use_bias=bias, rngs=rngs))
      elif kind == "general":
        layer = nnx.LinearGeneral((2, D // 2), D, axis=(-2, -1), rngs=rngs)
      elif kind == "einsum":
        layer = nnx.Einsum("...d,de->...e", (D, D), (D,), rngs=rngs)
      else:
        layer = nnx.Linear(D, D, rngs=rngs)
      setattr(self, f"d{i}", layer)

  def __call__(self, x):
    return _forward(self.m, _NnxOps(self), x)


class _LinenModel(nn.Module):
  m: dict

  @nn.compact
  def __call__(self, x):
    m, made = self.m, {}

    class Ops:
      def _layer(self, name, make):
        if name not in made:
          made[name] = make()
        return made[name]

      def _call(self, layer, h):
        return _keyword(layer, h) if m["hazard"] == "keyword" else layer(h)

      def embed(self, ids):
        return self._layer("wte", lambda: nn.Embed(V, D, name="wte"))(ids)

      def lookup(self, ids):
        return self._layer("tab", lambda: nn.Embed(*_table_shape(m), name="tab"))(ids)

      def table(self):
        return self._layer("wte", lambda: nn.Embed(V, D, name="wte")).embedding

      def attend(self, h):
        return self._layer("wte", lambda: nn.Embed(V, D, name="wte")).attend(h)

      def dense(self, i, h):
        return self._call(self._layer(i, lambda: nn.Dense(_out(i), name=f"d{i}")), h)

      def general(self, i, h):
        layer = self._layer(i, lambda: nn.DenseGeneral(D, axis=(-2, -1), name=f"d{i}"))
        return self._call(layer, h.reshape(h.shape[:-1] + (2, D // 2)))

      def norm(self, i, h):
        variant, scale, bias = m["blocks"][i][1]
        make = (lambda: nn.RMSNorm(use_scale=scale, name=f"d{i}")) if variant == "rms" else (
            lambda: nn.LayerNorm(use_scale=scale, use_bias=bias, name=f"d{i}"))
        return self._call(self._layer(i, make), h)

      def scan(self, h):
        return self._layer("stack", lambda: fuzz_scan.linen(D, m["scan_remat"]))(h, None)[0]

    return _forward(m, Ops(), x)


def _freeze(m):
  return {**m, "blocks": tuple(m["blocks"])}


@functools.lru_cache(maxsize=8)
def build(seed: int):
  """(model description, loss_fn, params, batch) of seed."""
  m = draw(seed)
  rng = np.random.default_rng(seed + 10_000)
  if m["tokens"]:
    x = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
    y = jnp.asarray(rng.integers(0, V, (B, T)), jnp.int32)
  else:
    x = jnp.asarray(rng.standard_normal((B, F0)), jnp.float32)
    y = jnp.asarray(rng.integers(0, V, (B,)), jnp.int32)
  batch = {"inputs": x, "targets": y}

  def xent(logits, targets):
    if not m["tokens"]:
      logits, targets = logits[:, None], targets[:, None]
    loss = per_example_xent(logits, targets)
    if m.get("per_batch") == "batch_size":  # a hand-written mean: ℓ_b alone is B times its row
      return loss / targets.shape[0]
    if m["mixing"] == "loss_mean":  # normalised by a batch statistic: mixes examples
      return loss / loss.mean()
    if m["mixing"] == "token_count":
      return loss / jnp.maximum((targets > 0).sum(), 1)
    return loss

  def penalty(p, first):
    return 0.05 * jnp.sum(jnp.square(first(p))) if m["hazard"] == "penalty" else 0.0

  if m["frontend"] == "plain":
    params = _plain_params(m, rng)
    first = lambda p: p["wte"]["embedding"] if "wte" in p else p["din"]["kernel"]
    model_loss = lambda p, b: xent(_forward(m, _Plain(m, p), b["inputs"]), b["targets"])
  elif m["frontend"] == "nnx":
    graphdef, params = nnx.split(nnx.eval_shape(lambda: _NnxModel(m, nnx.Rngs(seed))),
                                 nnx.Param)
    first = lambda p: jax.tree.leaves(p)[0]
    model_loss = lambda p, b: xent(nnx.merge(graphdef, p)(b["inputs"]), b["targets"])
  else:
    model = _LinenModel(_freeze(m))
    params = jax.eval_shape(model.init, jax.random.PRNGKey(seed), x)["params"]
    first = lambda p: jax.tree.leaves(p)[0]
    model_loss = lambda p, b: xent(model.apply({"params": p}, b["inputs"]), b["targets"])
  # Random values drawn in NumPy (no eager JAX op, no compile): scales near 1, the rest small.
  params = jax.tree.map(lambda a: jnp.asarray(
      (1.0 if a.ndim == 1 and a.shape[0] == D else 0.0)
      + 0.5 * rng.standard_normal(a.shape), np.float32), params)
  if m.get("module"):  # loss_fn(model, batch) on the merged module: `as_module`
    loss_fn = lambda mod, b: xent(mod(b["inputs"]), b["targets"]) + penalty(
        nnx.state(mod, nnx.Param), first)
    return m, (loss_fn, graphdef), params, batch
  loss_fn, params = as_passed(m, model_loss, params, penalty, first,
                               np.random.default_rng(seed + 40_000))
  return m, loss_fn, params, batch
