"""Exact or refused: the model patterns on which the surgery backend once returned wrong
statistics silently (issue 37), against a float64 per-example loop (`any_models.reference64`).

Each is refused by surgery with an `Unsupported` naming the leaf and the offending use, and
backend="auto" falls back to vmap (a one-time warning) with exact statistics, clipped
mean included; keyword inputs and taps under `jax.vmap` work or are refused, never crash.
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
  """One leaf refused: auto (off CPU) keeps surgery for the others (surgery_vmap), warning
  once; on CPU it runs vmap for the whole model (the refused kernel's matmul is not read
  through its slice: its own vmap pass would cost more there)."""
  monkeypatch.setattr(api, "_WARNED", set())
  loss_fn, params, _ = REFUSED["penalty"]
  batch = am.batch(3)
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    for _ in range(2):  # decided from an abstract trace: nothing runs
      assert ps.decide(loss_fn, params, batch, ps.StatsRequest(("sq",)),
                       platform="gpu") == "surgery_vmap"
  msgs = [str(w.message) for w in seen if "vmap" in str(w.message)]
  assert len(msgs) == 1, msgs
  assert "up/kernel" in msgs[0] and "backend='surgery_vmap'" in msgs[0]


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
  """The same with the parameters passed to the jit (inside it they are the jit's arguments,
  which the proof traces back to the leaves)."""
  block = jax.jit(lambda q, x: jnp.tanh(taps.dense(x, q["kernel"], q["bias"])))
  h = block(p["up"], taps.embed(b["inputs"], p["wte"]))
  return per_example_xent(taps.dense(h, p["head"]["kernel"], p["head"]["bias"]), b["targets"])


def test_layer_calls_inside_an_inner_jit_are_exact_or_refused():
  """A jit closing over its parameters: every statistic against the float64 loop, with and
  without clipping. A jit whose parameters are passed as its arguments (lifted calls, which
  the proof traces back to the leaves, `surgery/lifted.py`): exact without clipping; per-example
  clipping through it is refused, naming the leaf."""
  params, batch = _plain_params(), am.batch(4)
  ref = am.reference64(_jitted_block, params, batch)
  C = _clip(ref)
  for clip, r in ((None, ref), (C, am.reference64(_jitted_block, params, batch, clip=C))):
    _, stats = jax.jit(lambda p, b, c=clip: ps.compute(
        _jitted_block, p, b, want=ALL, backend="surgery", per_example_clip=c))(params, batch)
    assert am.mismatches(stats, r) == [], clip
  _, stats = ps.compute(_jitted_arguments, params, batch, want=ALL, backend="surgery")
  assert am.mismatches(stats, am.reference64(_jitted_arguments, params, batch)) == []
  with pytest.raises(Unsupported, match="'up/.*per-example clipping of a layer call inside "
                                        r"jax\.jit\b(?! / )"):
    ps.compute(_jitted_arguments, params, batch, want=ALL, backend="surgery",
               per_example_clip=C)


class _BiasTableLM(nn.Module):
  """Attention with a table looked up on ids without the example axis: ALiBi-style slopes
  nn.Embed(H, 1)(arange(H))[:, 0] ("alibi"), a T5-style relative-position bias nn.Embed
  on [T, T] bucket ids, transposed to [H, T, T] ("relative"), or learned positions added
  to the tokens' embeddings ("positions": broadcast against the batch, exact)."""

  table: str = "alibi"

  @nn.compact
  def __call__(self, ids):
    x = nn.Embed(V, D, name="wte")(ids)
    if self.table == "positions":
      x = x + nn.Embed(T, D, name="wpe")(jnp.arange(T))
    split = lambda a: a.reshape(a.shape[0], T, am.H, D // am.H)
    q, k = split(nn.Dense(D, name="q")(x)), split(nn.Dense(D, use_bias=False, name="k")(x))
    logits = jnp.einsum("bthd,bshd->bhts", q, k)
    dist = jnp.arange(T)[None, :] - jnp.arange(T)[:, None]
    if self.table == "alibi":
      slopes_H = nn.Embed(am.H, 1, name="slopes")(jnp.arange(am.H))[:, 0]
      logits = logits + slopes_H[:, None, None] * dist.astype(jnp.float32)
    elif self.table == "relative":
      bias_TxTxH = nn.Embed(7, am.H, name="rel")(jnp.clip(dist, -3, 3) + 3)
      logits = logits + jnp.transpose(bias_TxTxH, (2, 0, 1))
    h = jnp.einsum("bhts,bshd->bthd", jax.nn.softmax(logits), split(nn.Dense(D, name="v")(x)))
    return nn.Dense(V, name="head")(h.reshape(h.shape[0], T, D))


def _bias_table(table):
  model = _BiasTableLM(table)
  params = model.init(jax.random.PRNGKey(0), jnp.zeros((1, T), jnp.int32))["params"]
  params = jax.tree.map(lambda a: a + 0.3, params)
  return (lambda p, b: per_example_xent(model.apply({"params": p}, b["inputs"]), b["targets"]),
          params)


@pytest.mark.parametrize("table, leaf", [
    pytest.param("alibi", "slopes/embedding", marks=pytest.mark.extended),
    ("relative", "rel/embedding"), ("positions", None)])
def test_a_table_looked_up_without_the_example_axis_is_exact_or_refused_by_name(table, leaf):
  """Surgery never broadcasts a shared call's output where the model does not: the ALiBi
  slopes and the relative bias are refused naming the table (no TypeError), the learned
  positions are exact; auto gives the float64 loop's statistics on every leaf (surgery for
  the proven ones, the refused table through its slice: `surgery_vmap`, on CPU too)."""
  loss_fn, params = _bias_table(table)
  batch = am.batch(4)
  ref = am.reference64(loss_fn, params, batch)
  if leaf is None:
    _, stats = ps.compute(loss_fn, params, batch, want=ALL, backend="surgery")
    assert am.mismatches(stats, ref) == []
    return
  with pytest.raises(Unsupported, match=f"'{leaf}'.*without an example axis"):
    ps.compute(loss_fn, params, batch, want=ALL, backend="surgery")
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    request = ps.StatsRequest(ALL)
    assert ps.decide(loss_fn, params, batch, request, platform="gpu") == "surgery_vmap"
    assert ps.decide(loss_fn, params, batch, request, platform="cpu") == "surgery_vmap"
    for backend in ("auto", "surgery_vmap"):
      _, stats = jax.jit(lambda p, b, be=backend: ps.compute(loss_fn, p, b, want=ALL,
                                                             backend=be))(params, batch)
      assert am.mismatches(stats, ref) == [], backend


class _ScannedNnxLM(nnx.Module):
  """NNX as NNX users write it: blocks stacked by nnx.vmap, run by nnx.scan with nnx.remat
  inside, the head through nnx.jit."""

  def __init__(self, rngs, n_layers=2):
    self.wte = nnx.Embed(V, D, rngs=rngs)

    @nnx.split_rngs(splits=n_layers)
    @nnx.vmap(in_axes=(0,), out_axes=0)
    def blocks(rngs):
      return am.NnxResidualBlock(D, rngs)

    self.blocks = blocks(rngs)
    self.head = nnx.Linear(D, V, rngs=rngs)

  def __call__(self, ids):
    @nnx.scan(in_axes=(nnx.Carry, 0), out_axes=nnx.Carry)
    @nnx.remat
    def body(x, block):
      return block(x).astype(x.dtype)  # the carry keeps its dtype (float64 in the reference)

    return nnx.jit(lambda head, h: head(h))(self.head, body(self.wte(ids), self.blocks))


@pytest.mark.extended  # ~1 min: four backends on a scanned NNX model
def test_an_nnx_module_passed_as_params_works_on_every_backend():
  """compute(loss(model, batch), model, batch): the engine splits the module (nnx.scan,
  nnx.remat, nnx.jit inside) and merges it inside the loss; surgery (through the scan and
  remat, `surgery/lifted.py`), vmap, auto and the loop give the float64 loop's statistics; a
  loss closing over the module is refused in one line saying how to pass it."""
  model, batch = _ScannedNnxLM(nnx.Rngs(0)), am.batch(4)
  loss_fn = lambda m, b: per_example_xent(m(b["inputs"]), b["targets"])
  merged, state = api.nnx_split(loss_fn, model)
  ref = am.reference64(merged, state, batch)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for backend in ("surgery", "auto", "vmap", "loop"):
      _, stats = ps.compute(loss_fn, model, batch, want=ALL, backend=backend)
      assert am.mismatches(stats, ref) == [], backend
  closed = lambda p, b: per_example_xent(model(b["inputs"]), b["targets"])
  with pytest.raises(ValueError, match="pass the model as params"):
    ps.compute(closed, state, batch, want=ALL)
