"""Parity of the surgery backend with independent references on every parameter leaf.

- per-example: a Python loop of jax.grad over single examples;
- per-token: each intercepted layer's input x and output cotangent δ are captured by
  a different mechanism (a zero added to the layer output), and every token's
  contribution is formed explicitly as the VJP of the layer's own Flax apply with δ
  masked to that token (tied embedding: the lookup and attend contributions of the
  same token are summed), then squared / signed and summed.
"""

import functools
import os
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import pergrad.stats as ps
from pergrad.loss import make_loss_fn
from pergrad.model import ModelSpec, Transformer, init_params
from pergrad.stats.surgery import dense
from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery.sites import Site

V, T = 17, 5
CONFIGS = {
    "untied-ln-learned-bias": dict(norm="layernorm", positions="learned", use_bias=True),
    "tied-rms-rope": dict(norm="rmsnorm", positions="rope", tie_embeddings=True),
    "tied-ln-learned-bias": dict(norm="layernorm", positions="learned", use_bias=True,
                                 tie_embeddings=True),
}
ALL = ("mean", "sq", "sign", "norms")
# Every B for the two configurations that together cover each option; B=3 for the third.
CASES = [(name, B) for name in list(CONFIGS)[:2] for B in (1, 3, 8)] + [
    (list(CONFIGS)[2], 3)]


def _cases(extended):
  """CASES, those in `extended` under the extended marker: each test keeps a covering set
  in the main suite (every configuration, every B, tied and untied at B = 1 or 8)."""
  assert set(extended) < set(CASES)
  return [pytest.param(*c, marks=[pytest.mark.extended] * (c in extended)) for c in CASES]


U, T_RMS = list(CONFIGS)[:2]


@functools.lru_cache(maxsize=None)
def _model(name):
  spec = ModelSpec(n_layers=1, d_model=12, n_heads=3, d_ff=20, vocab_size=V, seq_len=T,
                   **CONFIGS[name])
  model = Transformer(spec)
  params = jax.jit(init_params, static_argnums=0)(spec, jax.random.PRNGKey(0))
  # Non-zero biases and norm offsets so that every leaf has a generic gradient.
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda p: p + 0.1 * rng.standard_normal(p.shape, np.float32), params)
  return model, make_loss_fn(model), params


def _setup(name, B):
  rng = np.random.default_rng(B)
  ids = rng.integers(0, 6, (B, T), dtype=np.int32)  # few distinct ids: repeats in a sequence
  targets = rng.integers(0, V, (B, T), dtype=np.int32)
  return _model(name) + ({"inputs": jnp.asarray(ids), "targets": jnp.asarray(targets)},)


@functools.lru_cache(maxsize=None)
def _jitted_value_and_grad(loss_fn):
  return jax.jit(jax.value_and_grad(lambda p, b: loss_fn(p, b).mean()))


def surgery(loss_fn, params, batch, want, granularity, **options):
  """(loss, GradStats) of the surgery backend, through the dispatcher, with
  StatsOptions(**options)."""
  return ps.compute(loss_fn, params, batch, ps.StatsRequest(want, granularity),
                    ps.StatsOptions(**options), backend="surgery")


_surgery = jax.jit(surgery, static_argnums=(0, 3, 4))


def _per_example_reference(loss_fn, params, batch):
  """Per-example gradients stacked on a leading axis (Python loop)."""
  value_and_grad = _jitted_value_and_grad(loss_fn)
  B = batch["inputs"].shape[0]
  gs = [value_and_grad(params, jax.tree.map(lambda a, b=b: a[b:b + 1], batch))[1]
        for b in range(B)]
  return jax.tree.map(lambda *g: jnp.stack(g), *gs)


# The references of one (model, B), computed once per session and shared by every parity
# test of that setup: here, tests/test_stats_registry.py and tests/test_gns.py.
@functools.lru_cache(maxsize=None)
def per_example_samples(name, B):
  """_per_example_reference of _setup(name, B)."""
  _, loss_fn, params, batch = _setup(name, B)
  return _per_example_reference(loss_fn, params, batch)


@functools.lru_cache(maxsize=None)
def batch_reference(name, B):
  """(mean loss, gradient of the mean loss) of _setup(name, B) by plain autodiff."""
  _, loss_fn, params, batch = _setup(name, B)
  return _jitted_value_and_grad(loss_fn)(params, batch)


@functools.lru_cache(maxsize=None)
def per_token_samples(name, B):
  """_per_token_reference of _setup(name, B)."""
  model, _, params, batch = _setup(name, B)
  return jax.jit(functools.partial(_per_token_reference, model))(params, batch)


_HANDLED = (nn.Dense, nn.DenseGeneral, nn.Embed, nn.LayerNorm, nn.RMSNorm)


def _per_token_reference(model, params, batch):
  """Per-token contributions B·T · vjp_θ(layer)(δ ⊙ 1_bt), leaves (B*T, *shape)."""
  B, _ = batch["inputs"].shape
  calls = []

  def objective(eps):
    xs = []

    def icp(next_fun, args, kwargs, ctx):
      if type(ctx.module) not in _HANDLED or ctx.method_name not in ("__call__", "attend"):
        return next_fun(*args, **kwargs)
      x = args[0]
      y = next_fun(*args, **kwargs)
      shared = x.ndim == 1  # the position embedding, called on arange(T)
      if shared:
        y = jnp.broadcast_to(y, (B,) + y.shape)
      if eps is None:
        calls.append((ctx.module.path, ctx.module.clone(parent=None), ctx.method_name,
                      shared, y.shape))
      xs.append(x)
      return y if eps is None else y + eps[len(xs) - 1]

    with nn.intercept_methods(icp):
      return make_loss_fn(model)(params, batch).mean(), xs

  objective(None)
  eps = [jnp.zeros(c[-1]) for c in calls]
  deltas, xs = jax.grad(objective, has_aux=True)(eps)
  masks_NxBxT = jnp.eye(B * T).reshape(B * T, B, T)
  per_token = {}
  for (path, mod, method, shared, _), x, d in zip(calls, xs, deltas, strict=True):
    sub = params
    for k in path:
      sub = sub[k]

    def layer(p, mod=mod, method=method, shared=shared, x=x):
      y = mod.apply({"params": p}, x, method=method)
      return jnp.broadcast_to(y, (B,) + y.shape) if shared else y

    _, vjp = jax.vjp(layer, sub)
    g = jax.vmap(lambda m, d=d, vjp=vjp: vjp(d * m.reshape(m.shape + (1,) * (d.ndim - 2)))[0])(
        masks_NxBxT)
    g = jax.tree.map(lambda a: a * (B * T), g)
    per_token[path] = g if path not in per_token else jax.tree.map(jnp.add, per_token[path], g)

  def at(path_leaf):
    path, leaf = tuple(str(k.key) for k in path_leaf[:-1]), path_leaf[-1].key
    return per_token[path][leaf]

  return jax.tree_util.tree_map_with_path(lambda kp, _: at(kp), params)


def _check(stats, samples, want, batch_grad):
  """Compares every requested statistic with the stacked samples, leaf by leaf."""
  stats, samples, batch_grad = jax.device_get((stats, samples, batch_grad))
  n = jax.tree.leaves(samples)[0].shape[0]
  assert float(stats.count) == n
  scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(samples))
  check = functools.partial(np.testing.assert_allclose, rtol=1e-4)
  for kp, g in jax.tree_util.tree_flatten_with_path(samples)[0]:
    get = lambda tree, kp=kp: functools.reduce(lambda t, k: t[k.key], kp, tree)
    name = jax.tree_util.keystr(kp)
    check(get(stats.mean), get(batch_grad), atol=1e-6 * scale, err_msg=f"mean {name}")
    check(get(stats.mean), g.mean(0), atol=1e-6 * scale, err_msg=f"sample mean {name}")
    if "sq" in want:
      check(get(stats.sum_sq), np.square(g).sum(0), atol=1e-6 * scale**2, err_msg=f"sq {name}")
    if "sign" in want:
      a = np.abs(g)
      ok = np.all((a == 0) | (a > 1e-5 * scale), axis=0)  # no sample near a sign flip
      np.testing.assert_allclose(np.where(ok, get(stats.sum_sign), 0),
                                 np.where(ok, np.sign(g).sum(0), 0), atol=1e-5,
                                 err_msg=f"sign {name}")
    if "norms" in want:
      check(get(stats.sq_norms), np.square(g).reshape(n, -1).sum(-1), atol=1e-6 * scale**2,
            err_msg=f"norms {name}")


@pytest.mark.parametrize("name,B", _cases({(U, 8), (T_RMS, 1), (T_RMS, 8)}))
def test_per_example_matches_loop(name, B):
  _, loss_fn, params, batch = _setup(name, B)
  samples = per_example_samples(name, B)
  batch_loss, batch_grad = batch_reference(name, B)
  loss, stats = _surgery(loss_fn, params, batch, ALL, "example")
  np.testing.assert_allclose(loss, batch_loss, rtol=1e-6)
  _check(stats, samples, ALL, batch_grad)
  if B != 3:
    return
  # Norms alone take the Gram ("ghost") route where it is cheaper: same answer.
  _, norms_only = _surgery(loss_fn, params, batch, ("norms",), "example")
  _check(norms_only, samples, ("norms",), batch_grad)


@pytest.mark.parametrize("name,B", _cases({(U, 1), (T_RMS, 8)}))
def test_per_token_matches_explicit_contributions(name, B):
  _, loss_fn, params, batch = _setup(name, B)
  samples = per_token_samples(name, B)
  _, batch_grad = batch_reference(name, B)
  _, stats = _surgery(loss_fn, params, batch, ("mean", "sq", "sign"), "token")
  assert stats.sq_norms is None
  _check(stats, samples, ("sq", "sign"), batch_grad)


def test_ghost_and_materialised_norms_agree():
  left = jax.random.normal(jax.random.PRNGKey(0), (4, 3, 7))
  right = jax.random.normal(jax.random.PRNGKey(1), (4, 3, 5))
  ref = jnp.square(jnp.einsum("brp,brq->bpq", left, right)).sum((1, 2))
  assert sm.ghost_norm_is_cheaper(3, 7, 5) and not sm.ghost_norm_is_cheaper(30, 7, 5)
  np.testing.assert_allclose(sm.outer_example_stats(left, right, ("norms",))["norms"], ref,
                             rtol=1e-5)
  np.testing.assert_allclose(sm.outer_example_stats(left, right, ("sq", "norms"))["norms"], ref,
                             rtol=1e-5)


class _Scaled(nn.Module):
  @nn.compact
  def __call__(self, x):
    return x * self.param("w", nn.initializers.ones, (x.shape[-1],))


class _Net(nn.Module):
  custom: bool = True

  @nn.compact
  def __call__(self, tokens):
    x = nn.Embed(7, 4)(tokens)
    if self.custom:
      return nn.Dense(7)(_Scaled()(x))
    dense = nn.Dense(4)
    return dense(dense(x))  # one layer used twice


def _tiny_net(custom):
  net = _Net(custom)
  batch = {"inputs": jnp.zeros((2, 3), jnp.int32), "targets": jnp.zeros((2, 3), jnp.int32)}
  params = net.init(jax.random.PRNGKey(0), batch["inputs"])["params"]
  return make_loss_fn(net), params, batch


def test_unsupported_layer_gives_clear_error():
  loss_fn, params, batch = _tiny_net(custom=True)
  with pytest.raises(ValueError, match=r"cannot handle _Scaled at '_Scaled_0'.*backend='vmap'"):
    surgery(loss_fn, params, batch, ("sq",), "example")
  loss_fn, params, batch = _tiny_net(custom=False)
  with pytest.raises(ValueError, match=r"'Dense_0' is used 2 times.*backend='vmap'"):
    surgery(loss_fn, params, batch, ("sq",), "example")


@pytest.mark.parametrize("want,granularity,msg", [
    (("mean", "var"), "example", "unknown statistic"),
    (("sq",), "sequence", "granularity"),
    (("norms",), "token", "only at granularity='example'"),
])
def test_invalid_requests(want, granularity, msg):
  _, loss_fn, params, batch = _setup("tied-rms-rope", 3)
  with pytest.raises(ValueError, match=msg):
    surgery(loss_fn, params, batch, want, granularity)


def test_chunked_per_token_outer_stats_match_one_shot():
  left = jax.random.normal(jax.random.PRNGKey(0), (2, 6, 3))
  right = jax.random.normal(jax.random.PRNGKey(1), (2, 6, 4))
  one = sm.outer_token_stats(left, right, ("sq", "sign"), scale=2.0)
  chunked = sm.outer_token_stats(left, right, ("sq", "sign"), scale=2.0, max_elems=30)
  sq_ref = np.square(2.0 * np.einsum("brp,brq->brpq", left, right)).sum((0, 1))
  np.testing.assert_allclose(one["sq"], sq_ref, rtol=1e-5)
  for k in one:
    np.testing.assert_allclose(chunked[k], one[k], rtol=1e-5)



def test_unrolled_scans_count_every_chunk_and_change_nothing():
  """bench_stats counts FLOPs with StatsOptions(scan_unroll=True): XLA's cost analysis
  counts a loop body once, so the chunked statistics would look cheaper than they are."""
  left = jax.random.normal(jax.random.PRNGKey(0), (2, 16, 8))
  right = jax.random.normal(jax.random.PRNGKey(1), (2, 16, 12))
  fn = lambda l, r, unroll=1: sm.outer_token_stats(  # B·(R/4)·(P+Q): 4 chunks
      l, r, ("sq", "sign"), max_elems=2 * 4 * 20, unroll=unroll)

  def flops(f):
    ca = jax.jit(f).lower(left, right).compile().cost_analysis()
    return (ca[0] if isinstance(ca, (list, tuple)) else ca)["flops"]

  rolled, out = flops(fn), jax.jit(fn)(left, right)
  g = functools.partial(fn, unroll=True)
  unrolled, out_u = flops(g), jax.jit(g)(left, right)
  assert unrolled > 3 * rolled  # 4 chunks of matmuls instead of 1 counted
  for k in out:
    np.testing.assert_allclose(out_u[k], out[k], rtol=1e-6)


_SHARDED = """
import jax, numpy as np, sys
sys.path.insert(0, "tests")
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
import test_surgery as ts
assert jax.device_count() == 2
_, loss_fn, params, batch = ts._setup("tied-rms-rope", 8)
for want, gran in [(ts.ALL, "example"), (("mean", "sq", "sign"), "token")]:
  f = jax.jit(lambda p, b: ts.surgery(loss_fn, p, b, want, gran))
  ref = f(params, batch)
  sharding = NamedSharding(Mesh(np.array(jax.devices()), ("data",)), P("data"))
  out = f(params, jax.device_put(batch, sharding))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6 * abs(b).max()),
               out, ref)
print("ok")
"""


@pytest.mark.extended
def test_batch_sharded_over_two_devices_matches_one_device():
  env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2",
             JAX_PLATFORMS="cpu")
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  r = subprocess.run([sys.executable, "-c", _SHARDED], env=env, cwd=root, capture_output=True,
                     text=True, timeout=300)
  assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


# --- the "simultaneous" dense method ------------------------------------------------------


@pytest.mark.parametrize("method,want", [
    ("simultaneous", ALL),
    pytest.param("separate", ("mean", "norms"), marks=pytest.mark.extended),
    pytest.param("simultaneous", ("mean", "norms"), marks=pytest.mark.extended),
    pytest.param("separate", ALL, marks=pytest.mark.extended)])
def test_both_dense_methods_match_loop(method, want):
  """Per-example gradients formed once with the weight gradient as their sum
  ("simultaneous"), or autodiff's weight gradient beside the tap's statistics
  ("separate"): the same numbers as the loop, every leaf, tied and untied."""
  for name in ("untied-ln-learned-bias", "tied-rms-rope"):
    _, loss_fn, params, batch = _setup(name, 3)
    batch_loss, batch_grad = batch_reference(name, 3)
    loss, stats = jax.jit(lambda p, b, w=want, f=loss_fn: surgery(
        f, p, b, w, "example", dense_method=method))(params, batch)
    _check(stats, per_example_samples(name, 3), want, batch_grad)
    np.testing.assert_allclose(loss, batch_loss, rtol=1e-6)


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_auto_takes_simultaneous_for_norms_at_long_sequences_and_counts_its_flops():
  """At T² > KL/(K+L) the rule picks the simultaneous method for every dense layer, and
  the step with all-layer per-example norms then costs ≤ 1.05x the FLOPs of the plain
  value_and_grad (XLA's count; the separate method costs ~1.3x)."""
  from pergrad.bench.xla_costs import flops_of
  spec = ModelSpec(n_layers=2, d_model=32, n_heads=4, d_ff=64, vocab_size=64, seq_len=64)
  loss_fn = make_loss_fn(Transformer(spec))
  params = init_params(spec, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, 64, (4, 64)), jnp.int32)
           for k in ("inputs", "targets")}
  site = Site(path=("d",), kind="dense", leaves=("kernel",), selected=True, in_axis=0,
              out_axis=0, contract=(2,), out_features=64)
  assert dense.simultaneous_is_used(site, 4, (4, 64, 32), ("mean", "norms"), False)
  assert not dense.simultaneous_is_used(site, 4, (4, 2, 32), ("mean", "norms"), False)
  assert not dense.simultaneous_is_used(site, 4, (4, 64, 32), ("mean", "norms"), True)
  flops = lambda f: flops_of(jax.jit(f).lower(params, batch).compile())
  plain = flops(jax.grad(lambda p, b: loss_fn(p, b).mean()))
  ratio = {}
  for method in ("auto", "separate"):
    ratio[method] = flops(lambda p, b, m=method: surgery(
        loss_fn, p, b, ("mean", "norms"), "example", dense_method=m)) / plain
  assert ratio["auto"] <= 1.05 < ratio["separate"], ratio
  with pytest.raises(ValueError, match="choose one of"):
    ps.StatsOptions(dense_method="fast")
