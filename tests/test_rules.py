"""pergrad.analysis.rules: the equivalence (collapse) test by simulation, the divergence rule,
per-leaf aggregates and the part-whole GNS regression on constructed data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from pergrad.analysis import gns_terms, leafwise, rules

# Seed noise like the batch_scaling runs': 3 seeds, 20 eval points, AR(1) along the curve
# (ρ = 0.5; the cpu runs' second-half lag-1 correlation of seed deviations is 0.15-0.67 for
# the curves that train well). Under this noise today's rule passes identical curves 37-40%
# of the time, the 37-45% the reviewer measured.
N_SIMS, N_SEEDS, N_POINTS, RHO = 400, 3, 20, 0.5


def spread_rule(a, b, fraction=0.9) -> bool:
  """The rule `experiments.batch_scaling` used: at ≥ 90% of the points the gap of seed
  means is within the combined seed spread √(s_A² + s_B²)."""
  gap = np.abs(a.mean(axis=0) - b.mean(axis=0))
  noise = np.sqrt(a.var(axis=0, ddof=1) + b.var(axis=0, ddof=1))
  return bool(np.mean(gap <= noise) >= fraction)


def test_welch_interval_matches_the_t_formula():
  a, b = [1.0, 1.2, 1.1], [0.9, 1.0, 0.8, 0.95]
  d, lo, hi = rules.welch_interval(a, b, alpha=0.05)
  assert d == pytest.approx(np.mean(a) - np.mean(b))
  assert lo < d < hi and (hi - d) == pytest.approx(d - lo)
  with pytest.raises(ValueError, match=">= 2"):
    rules.welch_interval([1.0], b)


# --------------------------------------------------------------------------- divergence


def test_diverged_above_ln_v_or_non_finite():
  v = 1024
  ln_v = math.log(v)
  assert not rules.diverged([5.0, ln_v - 1e-6, 4.0], v)  # just below ln V: trained
  assert rules.diverged([5.0, ln_v + 1e-3, 4.0], v)  # above it once trained: diverged
  assert rules.diverged([7.5, 35.16], v)  # preconditioner's MSQ at ε = 1e-8: ends above
  assert rules.diverged([5.0, math.nan], v) and rules.diverged([math.inf], v)
  assert rules.diverged([7.5, 5.0, -math.inf], v)
  # A random model starts above ln V (step-0 evals 7.3-7.5 at V = 1024), and a large
  # batch's first eval can still be there (6.94-7.02 at B = 256, 4 warmup steps in).
  assert not rules.diverged([7.51, 6.96, 5.2, 4.9], v)
  assert not rules.diverged([7.51, 28.8, 9.0, 5.8], v)  # a spike before it ever trained
  assert not rules.diverged([], v)
  with pytest.raises(ValueError, match="vocab"):
    rules.diverged([1.0], 1)


def test_mark_diverged_on_tables():
  v = 256  # ln V = 5.545
  table = pd.DataFrame({
      "run": ["a"] * 3 + ["b"] * 3 + ["c"] * 3,
      "step": [0, 5, 10] * 3,
      # every run's initial eval sits above ln V (a random model): not counted
      "eval/loss": [5.9, 5.0, 4.0, 5.9, 5.0, 9.0, 5.9, 5.2, np.nan],
  }).iloc[::-1]  # any row order
  runs = rules.diverged_runs(table, v)
  assert runs.to_dict() == {"c": False, "b": True, "a": False}
  fin = pd.DataFrame({"run": ["a", "b", "c", "d"], "final_eval_loss": [4.0, 5.0, 5.2, 17.0],
                      "diverged": [False, False, False, False]})
  out = rules.mark_diverged(fin, v, table)
  assert out["diverged"].tolist() == [False, True, False, True]  # b: its history; d: final
  assert out["final_eval_loss"].tolist()[:3] == [4.0, math.inf, 5.2]
  assert math.isinf(out["final_eval_loss"].iloc[3]) and not fin["diverged"].any()


# --------------------------------------------------------------------------- per leaf


def test_leaf_aggregates_norm_leaf_dominates_the_sum():
  # μ̂²-like numerator and σ̂²/B-like denominator per leaf: a tiny norm leaf with a large
  # ratio carries most of Σnum, so Σnum/Σden > 1 while most parameters have ratio < 1.
  n_params = {"block_0/norm_attn/scale": 64, "block_0/attn/query/kernel": 4096,
              "block_0/mlp/fc_in/kernel": 16384, "embed/embedding": 8192,
              "LayerNorm_0/bias": 64}
  num = {"block_0/norm_attn/scale": 9.0, "block_0/attn/query/kernel": 0.5,
         "block_0/mlp/fc_in/kernel": 1.0, "embed/embedding": 1.2, "LayerNorm_0/bias": 2.0}
  den = {"block_0/norm_attn/scale": 1.0, "block_0/attn/query/kernel": 1.0,
         "block_0/mlp/fc_in/kernel": 2.0, "embed/embedding": 1.0, "LayerNorm_0/bias": 0.5}
  agg = leafwise.leaf_aggregates(num, den, n_params)
  assert agg["ratio_of_sums"] == pytest.approx(13.7 / 5.5)  # > 1
  assert agg["ratio_of_sums_no_norm"] == pytest.approx(2.7 / 4.0)  # < 1 without norm leaves
  total = sum(n_params.values())
  assert agg["share_params_above_1"] == pytest.approx((64 + 8192 + 64) / total)
  assert agg["share_params_above_1_no_norm"] == pytest.approx(8192 / (4096 + 16384 + 8192))
  assert agg["median"] == pytest.approx(1.2)  # ratios 9, 0.5, 0.5, 1.2, 4
  assert agg["weighted_median"] == pytest.approx(0.5)  # fc_in alone holds 57 % of params
  assert agg["median_no_norm"] == pytest.approx(0.5)
  assert agg["norm_share_num"] == pytest.approx(11.0 / 13.7)
  assert agg["norm_share_params"] == pytest.approx(128 / total) and agg["n_leaves_no_norm"] == 3
  assert "norm_share_den" in agg
  # The library's own classifier as the predicate gives the same split on these names.
  from pergrad.layer_types import layer_type

  lib = leafwise.leaf_aggregates(num, den, n_params,
                              is_norm=lambda p: layer_type(p.lower()) == "norm")
  assert lib == agg
  with pytest.raises(ValueError, match="n_params"):
    leafwise.leaf_aggregates(num, den, {"embed/embedding": 1})


def test_one_classifier_case_insensitive_with_flax_default_names():
  from pergrad.layer_types import layer_type

  norm = ["block_0/norm_attn/scale", "norm_final/bias", "h/ln_1/weight", "transformer/ln_f/b",
          "LayerNorm_0/scale", "RMSNorm_0/scale", "Block_1/LayerNorm_1/bias"]
  other = ["block_0/attn/query/kernel", "embed/embedding", "Embed_0/embedding",
           "unembed/kernel", "block_1/mlp/fc_out/kernel", "Dense_0/kernel"]
  for p in norm:
    assert leafwise.is_norm_leaf(p) and layer_type(p) == "norm", p
  for p in other:
    assert not leafwise.is_norm_leaf(p) and layer_type(p) != "norm", p
  assert layer_type("Embed_0/embedding") == "embedding"
  assert layer_type("MultiHeadDotProductAttention_0/query/kernel") == "attention"


def test_weighted_median():
  assert leafwise.weighted_median([3.0, 1.0, 2.0], [1, 1, 1]) == 2.0
  assert leafwise.weighted_median([3.0, 1.0, 2.0], [10, 1, 1]) == 3.0
  assert math.isnan(leafwise.weighted_median([], []))


# --------------------------------------------------------------------------- part-whole


def test_part_whole_separates_a_dominant_group_from_the_rest():
  rng = np.random.default_rng(0)
  t = np.arange(200)
  # The group's B_simple drifts over training; the rest of the model has its own,
  # unrelated noise scale. The group holds 90 % of |G|² (like the norm layers).
  g2_grp = np.full(200, 9.0)
  s_grp = g2_grp * (50 + 0.5 * t)
  g2_rest = np.full(200, 1.0)
  s_rest = g2_rest * (200 + 20 * rng.standard_normal(200))
  pw = gns_terms.part_whole(g2_grp + g2_rest, s_grp + s_rest, g2_grp, s_grp)
  assert pw.share_g2 == pytest.approx(0.9) and pw.median_share_g2 == pytest.approx(0.9)
  assert pw.share_s == pytest.approx(s_grp.sum() / (s_grp + s_rest).sum())
  assert pw.r_total > 0.95  # total tracks the group: part-whole
  assert abs(pw.r_complement) < 0.2  # the rest does not
  assert pw.n_steps == 200
  # A complement that does follow the group: r near 1, slope recovered.
  s_rest2 = g2_rest * (3.0 * s_grp / g2_grp + rng.standard_normal(200))
  pw2 = gns_terms.part_whole(g2_grp + g2_rest, s_grp + s_rest2, g2_grp, s_grp)
  assert pw2.r_complement > 0.99 and pw2.slope_complement == pytest.approx(3.0, rel=0.01)
  # Steps where the complement's |G|² is not positive are dropped.
  bad = g2_grp.copy()
  bad[:10] = 10.0
  assert gns_terms.part_whole(g2_grp + g2_rest, s_grp + s_rest, bad, s_grp).n_steps == 190
  with pytest.raises(ValueError, match="same steps"):
    gns_terms.part_whole(t, t, t, t[:5])


def test_the_analysis_package_imports_no_jax(tmp_path):
  """Every `pergrad.analysis` module imports, and reads a sweep into a table and its finals,
  without importing JAX (what its docstring promises notebooks and experiments)."""
  import subprocess
  import sys

  run = tmp_path / "optimizer.lr=0.1,train.seed=0"
  run.mkdir()
  (run / "metrics.jsonl").write_text('{"step": 1, "split": "eval", "loss": 3.0}\n')
  code = ("import sys\nfrom pergrad.analysis import calibrate, leafwise, plots, rules, runs\n"
          f"t = runs.aggregate({str(tmp_path)!r})\n"
          "assert runs.finals(t)['final_eval_loss'].tolist() == [3.0], t\n"
          "print(sorted(m for m in sys.modules if m == 'jax' or m.startswith('jax.')))\n")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
  assert out.stdout.strip() == "[]", out.stdout


