"""Gradient noise scale (`pergrad.stats.noise`, the tracker `track_gns`): known truth on
synthetic gradients, parity of the per-layer-type terms with NumPy on per-example gradients
of the loop reference (every backend, tied and untied embeddings, both tied conventions),
the tracker in training (every step) and the offline re-smoothing."""

from __future__ import annotations

import functools
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import test_surgery as ts  # the small models and their shared loop references

from pergrad.analysis import resmooth
from pergrad.layer_types import layer_type
from pergrad.loss import make_loss_fn
from pergrad.model import TIED_EMBEDDING, ModelSpec, Transformer, init_params
from pergrad.optim.noise_scale import GnsTrackerState, gns_metrics, track_gns
from pergrad.stats import StatsRequest, compute, noise, synthetic

K = 4.0  # z-score bound of the synthetic tests (each has a handful of comparisons)


# --- definitions ---------------------------------------------------------------------------


def test_layer_types_of_the_transformer():
  paths = noise.leaf_paths(_params(tied=False))
  kinds = {p: layer_type(p) for p in paths}
  assert kinds["block_0/norm_attn/scale"] == "norm"  # a norm inside attention: norm first
  assert kinds["norm_final/bias"] == "norm"
  assert kinds["block_0/attn/query/kernel"] == "attention"
  assert kinds["block_0/mlp/fc_in/kernel"] == "mlp"
  assert kinds["embed/embedding"] == kinds["pos_embed/embedding"] == "embedding"
  assert kinds["unembed/kernel"] == "unembedding"
  assert "other" not in kinds.values()
  groups = noise.groups_of(paths)
  assert sorted(i for k, idx in groups.items() if k != noise.TOTAL for i in idx) \
      == list(groups[noise.TOTAL]) == list(range(len(paths)))  # a partition of the leaves


def test_tied_conventions():
  paths = noise.leaf_paths(_params(tied=True))
  i = paths.index(TIED_EMBEDDING)
  inc = noise.groups_of(paths, tied_leaf=TIED_EMBEDDING, tied="include")
  exc = noise.groups_of(paths, tied_leaf=TIED_EMBEDDING, tied="exclude")
  assert i in inc["embedding"] and i in inc[noise.TOTAL] and "unembedding" not in inc
  assert all(i not in idx for idx in exc.values()) and len(exc[noise.TOTAL]) == len(paths) - 1
  with pytest.raises(ValueError, match="choose one of"):
    noise.groups_of(paths, tied="both")
  with pytest.raises(ValueError, match="not a parameter leaf"):
    noise.groups_of(paths, tied_leaf="embed/nope")


# --- known truth ---------------------------------------------------------------------------


def _source(seed=0):
  """Two leaves with signal, one without: |G|² = Σμ² and tr Σ = Σσ² known."""
  rng = np.random.default_rng(seed)
  mu = {"a": 0.3 * rng.standard_normal((20, 10)), "b": 0.1 * np.ones(50), "c": np.zeros(30)}
  sigma = {"a": 1.0, "b": 0.5 + rng.random(50), "c": 2.0}
  src = synthetic.GaussianSource(mu, sigma, seed=seed)
  G2 = sum(float(np.sum(m**2)) for m in jax.tree.leaves(src.mean))
  S = sum(float(np.sum(v)) for v in jax.tree.leaves(src.variance))
  return src, G2, S


def test_per_example_terms_recover_known_G2_and_trace():
  """Over 400 steps of B = 16: the mean of each step's |G|²_est and S_est is within K
  standard errors of Σμ² and Σσ², and the ratio of their means (what the EMAs estimate)
  is within K standard errors (delta method) of B_simple = Σσ²/Σμ²."""
  src, G2_true, S_true = _source()
  B, steps = 16, 400
  groups = noise.groups_of(noise.leaf_paths(src.mu))
  terms = [noise.group_terms(synthetic.grad_stats(src.step(B), ("mean", "norms")), groups)
           for _ in range(steps)]
  G2 = np.array([float(t[0][noise.TOTAL]) for t in terms])
  S = np.array([float(t[1][noise.TOTAL]) for t in terms])
  for est, truth in ((G2, G2_true), (S, S_true)):
    se = est.std(ddof=1) / np.sqrt(steps)
    assert abs(est.mean() - truth) < K * se, (est.mean(), truth, se)
  b_hat = S.mean() / G2.mean()
  cov = np.cov(S, G2) / steps
  grad = np.array([1 / G2.mean(), -S.mean() / G2.mean()**2])
  se = float(np.sqrt(grad @ cov @ grad))
  assert abs(b_hat - S_true / G2_true) < K * se, (b_hat, S_true / G2_true, se)
  # Per group: the leaf without signal has |G|² = 0 within its noise.
  c = noise.groups_of(["c"])
  G2_c = [float(noise.group_terms(synthetic.grad_stats({"c": s["c"]}, ("mean", "norms")),
                                c)[0][noise.TOTAL]) for s in (src.step(B) for _ in range(200))]
  assert abs(np.mean(G2_c)) < K * np.std(G2_c, ddof=1) / np.sqrt(200)


def test_two_batch_estimator_agrees_with_per_example_in_expectation():
  """Small batches of b = 4 inside B = 16 (microbatches or devices): both estimators are
  unbiased for Σμ² and Σσ², so their step-wise difference has mean 0 within its noise."""
  src, G2_true, S_true = _source(seed=1)
  B, b, steps = 16, 4, 400
  groups = noise.groups_of(noise.leaf_paths(src.mu))
  diffs, two = [], []
  for _ in range(steps):
    g = src.step(B)
    flat = np.concatenate([x.reshape(B, -1) for x in jax.tree.leaves(g)], axis=1)
    small = [np.sum(flat[i:i + b].mean(0)**2) for i in range(0, B, b)]
    big = np.sum(flat.mean(0)**2)
    G2_2, S_2 = noise.two_batch_terms(small, big, b, B)
    G2_1, S_1 = noise.group_terms(synthetic.grad_stats(g, ("mean", "norms")), groups)
    two.append((float(G2_2), float(S_2)))
    diffs.append((float(G2_2) - float(G2_1[noise.TOTAL]), float(S_2) - float(S_1[noise.TOTAL])))
  two, diffs = np.array(two), np.array(diffs)
  for j, truth in enumerate((G2_true, S_true)):
    se = two[:, j].std(ddof=1) / np.sqrt(steps)
    assert abs(two[:, j].mean() - truth) < K * se
    se_d = diffs[:, j].std(ddof=1) / np.sqrt(steps)
    assert abs(diffs[:, j].mean()) < K * se_d
  # b = 1 is the per-example form exactly.
  g = src.step(B)
  flat = np.concatenate([x.reshape(B, -1) for x in jax.tree.leaves(g)], axis=1)
  G2_1, S_1 = noise.group_terms(synthetic.grad_stats(g, ("mean", "norms")), groups)
  G2_b1, S_b1 = noise.two_batch_terms(np.sum(flat**2, 1), np.sum(flat.mean(0)**2), 1, B)
  np.testing.assert_allclose([G2_b1, S_b1], [G2_1[noise.TOTAL], S_1[noise.TOTAL]], rtol=1e-4)
  with pytest.raises(ValueError, match="b_big > b_small"):
    noise.two_batch_terms([1.0], 1.0, 4, 4)


# --- parity on the transformer ---------------------------------------------------------------

T, V = 8, 16


def _params(tied: bool):
  spec = ModelSpec(n_layers=1, d_model=12, n_heads=3, d_ff=20, vocab_size=V, seq_len=T,
                   tie_embeddings=tied)
  return jax.eval_shape(lambda: init_params(spec, jax.random.PRNGKey(0)))


def _numpy_terms(per_example, groups):
  """NumPy float64 terms from stacked per-example gradients, per group."""
  leaves = [np.asarray(x, np.float64).reshape(x.shape[0], -1)
            for x in jax.tree.leaves(per_example)]
  B = leaves[0].shape[0]
  out = {}
  for g, idx in groups.items():
    flat = np.concatenate([leaves[i] for i in idx], axis=1)
    P = np.mean(np.sum(flat**2, 1))
    gbar2 = np.sum(flat.mean(0)**2)
    out[g] = ((B * gbar2 - P) / (B - 1), (P - gbar2) / (1 - 1 / B))
  return out


_EXT = pytest.mark.extended
# The small models of tests/test_surgery.py, whose loop-reference per-example gradients
# (one Python loop of jax.grad per model and batch) are computed once per session and
# shared with the surgery and registry parity tests.
MODELS = {False: "untied-ln-learned-bias", True: "tied-rms-rope"}
PARITY_B = 8


@functools.lru_cache(maxsize=None)
def _jitted_compute(loss_fn, backend, request):
  return jax.jit(lambda p, b: compute(loss_fn, p, b, request=request, backend=backend))


def _compute(loss_fn, params, batch, backend, request):
  """compute() under jit (one program per setup), or eagerly for the Python-loop backend."""
  if backend == "loop":
    return compute(loss_fn, params, batch, request=request, backend=backend)
  return _jitted_compute(loss_fn, backend, request)(params, batch)


@pytest.mark.parametrize("backend,tied,convention", [
    ("surgery", True, "exclude"), ("vmap", False, "include"),
    pytest.param("surgery", False, "include", marks=_EXT),
    pytest.param("surgery", True, "include", marks=_EXT),
    pytest.param("loop", True, "exclude", marks=_EXT),
    pytest.param("vmap", True, "include", marks=_EXT),
    pytest.param("loop", False, "include", marks=_EXT)])
def test_group_terms_match_numpy_on_per_example_gradients(backend, tied, convention):
  _, loss_fn, params, batch = ts._setup(MODELS[tied], PARITY_B)
  groups = noise.groups_of(noise.leaf_paths(params), tied=convention,
                         tied_leaf=TIED_EMBEDDING if tied else None)
  _, stats = _compute(loss_fn, params, batch, backend, StatsRequest(want=("mean", "norms")))
  G2, S = noise.group_terms(stats, groups)
  want = _numpy_terms(ts.per_example_samples(MODELS[tied], PARITY_B), groups)
  assert set(G2) == set(want)
  for g, (g2, s) in want.items():
    np.testing.assert_allclose(float(G2[g]), g2, rtol=2e-3, atol=1e-6 * abs(s), err_msg=g)
    np.testing.assert_allclose(float(S[g]), s, rtol=2e-3, err_msg=g)
  # The terms add over the disjoint layer types.
  parts = [g for g in G2 if g != noise.TOTAL]
  np.testing.assert_allclose(sum(float(S[g]) for g in parts), float(S[noise.TOTAL]), rtol=1e-5)


# --- the tracker -----------------------------------------------------------------------------


def test_tracker_smooths_each_term_separately():
  src, _, _ = _source(seed=2)
  alpha = 0.9
  tracker = track_gns(alpha)
  state = tracker.init(src.mu)
  G2s, Ss = [], []
  for _ in range(30):
    stats = synthetic.grad_stats(src.step(8), ("mean", "norms"))
    state = tracker.update(state, stats)
    G2s.append(float(state.G2[noise.TOTAL]))
    Ss.append(float(state.S[noise.TOTAL]))
  m = gns_metrics(state)
  w = 1 - alpha**30
  ema = lambda xs: sum((1 - alpha) * alpha**(len(xs) - 1 - i) * x for i, x in enumerate(xs)) / w
  np.testing.assert_allclose(m["gns/total/G2_ema"], ema(G2s), rtol=1e-5)
  np.testing.assert_allclose(m["gns/total/S_ema"], ema(Ss), rtol=1e-5)
  np.testing.assert_allclose(m["gns/total/b_simple"], ema(Ss) / ema(G2s), rtol=1e-5)
  # Not the EMA of the per-step ratio.
  ratio_ema = ema([s / g for s, g in zip(Ss, G2s, strict=True)])
  assert abs(float(m["gns/total/b_simple"]) - ratio_ema) > 1e-3
  with pytest.raises(ValueError, match="norms"):
    tracker.update(state, synthetic.grad_stats(src.step(8), ("mean",)))
  with pytest.raises(ValueError, match="outside"):
    track_gns(1.0)


@pytest.mark.extended
def test_training_logs_gns_every_step_and_resmooth_reproduces_it(tmp_path):
  """`stats=gns` at the ci scale: gns/<type>/... on every step's record; the offline
  re-smoothing with the run's α equals the logged EMAs to float32 rounding (the device
  fuses multiply-adds; NumPy rounds twice), and another α gives other values."""
  from conftest import compose

  from pergrad.config import build_plan
  from pergrad.train.loop import run

  cfg = compose(["scale=ci", "stats=gns", "train.steps=12", "stats.log_every=5",
                 "stats.gns_alpha=0.8"])
  plan = build_plan(cfg)
  assert "norms" in plan.stats.request.want
  run(plan, tmp_path)
  rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  logged = [r for r in rows if "gns/total/b_simple" in r]
  assert [r["step"] for r in logged] == list(range(1, 13))
  types = {k.split("/")[1] for k in logged[0] if k.startswith("gns/")} - {noise.TOTAL}
  assert {"attention", "mlp", "embedding", "norm", "unembedding"} <= types
  again = resmooth(tmp_path, 0.8)
  for g in types | {noise.TOTAL}:
    for q in ("G2_ema", "S_ema", "b_simple"):
      online = np.array([r[f"gns/{g}/{q}"] for r in logged], np.float32)
      np.testing.assert_allclose(again[g][q], online, rtol=2e-6, err_msg=f"{g} {q}")
  other = resmooth(tmp_path, 0.5)[noise.TOTAL]["b_simple"]
  assert np.max(np.abs(other / again[noise.TOTAL]["b_simple"] - 1)) > 1e-3
  # One step's whole-model ratio is the logged diagnostics' snr2_example = Σμ̂²/Σσ̂²
  # (from the 'sq' sums, at example granularity) = |G|²_est / S_est (from the norms).
  diag = [r for r in rows if "opt/all/snr2_example" in r]
  assert diag
  for r in diag:
    np.testing.assert_allclose(r["opt/all/snr2_example"], r["gns/total/G2"] / r["gns/total/S"],
                               rtol=1e-3)
  with pytest.raises(ValueError, match="no gns"):
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "metrics.jsonl").write_text(json.dumps({"step": 1}) + "\n")
    resmooth(tmp_path / "plain", 0.9)


def test_bad_gns_settings_fail_in_the_plan():
  from conftest import compose

  from pergrad.config import build_plan
  with pytest.raises(ValueError, match=r"^stats.gns_alpha=1.5 is outside \[0, 1\)"):
    build_plan(compose(["scale=ci", "stats=gns", "stats.gns_alpha=1.5"]))
  with pytest.raises(Exception) as e:  # a choice: Hydra names the key and the options
    compose(["scale=ci", "stats=gns", "stats.gns_tied=maybe"])
  assert "stats.gns_tied" in str(e.value) and "[include, exclude]" in str(e.value.__cause__)


def test_tracker_beside_the_optimizer_and_request():
  from pergrad.optim import build_optimizer, optimizer_config
  from pergrad.optim.schedule import ScheduleConfig
  build = lambda **kw: build_optimizer(optimizer_config("adamw"), ScheduleConfig(),
                                       total_steps=10, batch_size=8, **kw)
  opt, plain = build(gns=track_gns(0.9)), build()
  assert "norms" in opt.request.want and "norms" not in plain.request.want
  params = _params(tied=False)
  st = jax.eval_shape(opt.gns.init, params)
  assert isinstance(st, GnsTrackerState) and set(st.G2) == {
      "attention", "embedding", "mlp", "norm", "unembedding", noise.TOTAL}
  assert gns_metrics(plain.gns.init(params)) == {}
  # The optimizer state is the same with and without the tracker.
  assert (jax.tree.structure(jax.eval_shape(opt.tx.init, params))
          == jax.tree.structure(jax.eval_shape(plain.tx.init, params)))


# --- layer selection ---------------------------------------------------------------------------


def test_layer_selection_in_the_request():
  from pergrad.stats import StatsRequest
  r = StatsRequest(want=("mean", "norms"), layers=["norm", "block_*/attn/*"])
  assert r.layers == ("block_*/attn/*", "norm")
  base = StatsRequest()
  assert base.union(("norms",), "example", ("norm",)).layers == ("norm",)  # mean takes it
  sq = StatsRequest(want=("mean", "sq"))
  assert sq.union(("norms",), "example", ("norm",)).layers == ()  # all leaves cover both
  same = StatsRequest(want=("mean", "norms"), layers=("norm",))
  assert same.union(("sq",), "example", ("norm",)).layers == ("norm",)
  with pytest.raises(ValueError, match="layer type"):
    StatsRequest(want=("mean", "norms"), layers=("",))


@pytest.mark.parametrize("backend", ["surgery", pytest.param("vmap", marks=pytest.mark.extended)])
def test_norm_layers_only_match_the_loop_and_leave_the_rest_untouched(backend):
  """layers=("norm",): the norm leaves' per-example norms and squares equal the loop's,
  the mean gradient stays complete, the GNS groups are "norm" and its total; surgery
  computes nothing for the other leaves (zeros)."""
  from pergrad.stats.summaries import layer_summaries
  name, B = MODELS[False], PARITY_B  # layernorm: a scale and a bias per norm
  _, loss_fn, params, batch = ts._setup(name, B)
  req = StatsRequest(want=("mean", "sq", "norms"), layers=("norm",))
  _, stats = _compute(loss_fn, params, batch, backend, req)
  assert stats.layers == ("norm",)
  stacked = jax.tree.map(np.asarray, ts.per_example_samples(name, B))
  paths = noise.leaf_paths(params)
  flat = lambda t: dict(zip(paths, jax.tree.leaves(t), strict=True))
  g, sqn, sq, mean = flat(stacked), flat(stats.sq_norms), flat(stats.sum_sq), flat(stats.mean)
  for p in paths:
    np.testing.assert_allclose(mean[p], g[p].mean(0), rtol=1e-4, atol=1e-7, err_msg=p)
    if stats.selects(p):
      np.testing.assert_allclose(sqn[p], np.square(g[p]).reshape(B, -1).sum(1), rtol=1e-4,
                                 err_msg=p)
      np.testing.assert_allclose(sq[p], np.square(g[p]).sum(0), rtol=1e-4, atol=1e-9,
                                 err_msg=p)
    elif backend == "surgery":
      assert not np.any(sqn[p]) and not np.any(sq[p]), p
  assert sum(stats.selects(p) for p in paths) == 6  # 3 norms × (scale, bias)
  groups = noise.groups_of(paths, layers=stats.layers)
  assert set(groups) == {"norm", noise.TOTAL} and groups["norm"] == groups[noise.TOTAL]
  summ = layer_summaries(stats)
  assert "stats/block_0/norm_attn/scale/mu2_mean" in summ
  assert "stats/block_0/attn/query/kernel/mu2_mean" not in summ
  assert "stats/block_0/attn/query/kernel/gbar2_mean" in summ
  with pytest.raises(ValueError, match="selects no parameter leaf"):
    compute(loss_fn, params, batch, backend="surgery",
            request=StatsRequest(want=("mean", "norms"), layers=("nothing/*",)))


@pytest.mark.extended
def test_training_with_norm_layers_only_tracks_their_gns(tmp_path):
  from conftest import compose

  from pergrad.config import build_plan
  from pergrad.train.loop import run
  plan = build_plan(compose(["scale=ci", "stats=gns_norm", "train.steps=6"]))
  assert plan.stats.request.layers == ("norm",) and plan.stats.backend == "surgery"
  run(plan, tmp_path)
  terms = resmooth(tmp_path, 0.95)
  assert set(terms) == {"norm", noise.TOTAL} and len(terms["norm"]["step"]) == 6
  np.testing.assert_array_equal(terms["norm"]["S"], terms[noise.TOTAL]["S"])


def test_norm_layers_only_cost_about_no_flops():
  """Surgery with layers=("norm",) at the tiny preset's width (128): ≤ 1.01x the FLOPs of
  a plain step (XLA's count; 1.002x at the tiny preset itself, B = 32, T = 128; 1.010x at
  width 64). The extra is each normalization layer's x̂ recomputed and its per-example
  row sums, O(B·T·D), against the matmuls' O(B·T·D²)."""
  from pergrad.bench.xla_costs import flops_of
  from pergrad.stats import StatsRequest
  spec = ModelSpec(n_layers=1, d_model=128, n_heads=4, d_ff=512, vocab_size=64, seq_len=32)
  loss_fn = make_loss_fn(Transformer(spec))
  params = init_params(spec, jax.random.PRNGKey(0))
  rng = np.random.default_rng(0)
  batch = {k: jnp.asarray(rng.integers(0, 64, (4, 32)), jnp.int32) for k in ("inputs", "targets")}
  cost = lambda f: flops_of(jax.jit(f).lower(params, batch).compile())
  plain = cost(jax.grad(lambda p, b: loss_fn(p, b).mean()))
  req = StatsRequest(want=("mean", "norms"), layers=("norm",))
  norm_only = cost(lambda p, b: compute(loss_fn, p, b, request=req, backend="surgery"))
  assert norm_only <= 1.01 * plain, norm_only / plain
