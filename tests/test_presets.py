"""Accelerator presets on CPU: bf16 compute against float32, and the `paper` model at its
real width for a few steps (shape and config check)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import pytest
from conftest import compose

import pergrad.stats as ps
from pergrad.config import build_plan
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer, init_params
from pergrad.train import run
from pergrad.train.metrics import read_records

SHORT = ("train.steps=20", "train.eval_every=10", "train.checkpoint_every=0",
         "logging.log_every=5", "stats=example", "stats.log_every=10")
# bf16 vs float32 after 20 steps of the tiny test model: the losses must agree to this many
# nats (measured: 1.3e-4 train, 5e-5 eval; bf16 keeps 8 bits of mantissa in the matmuls,
# parameters and optimizer state stay float32).
BF16_TOL = 0.01


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_overrides):
  out = {}
  for dtype in ("float32", "bfloat16"):
    d = tmp_path_factory.mktemp(dtype)
    plan = build_plan(compose([*tiny_overrides, *SHORT, f"model.compute_dtype={dtype}"]))
    out[dtype] = (run(plan, d, echo=lambda s: None), d)
  return out


@pytest.mark.extended
def test_bf16_compute_tracks_float32(runs):
  f32, bf16 = runs["float32"][0], runs["bfloat16"][0]
  assert bf16["status"] == "completed" and math.isfinite(bf16["final_train_loss"])
  for key in ("final_train_loss", "final_eval_loss"):
    assert abs(bf16[key] - f32[key]) < BF16_TOL, (key, bf16[key], f32[key])
  stats = [r for r in read_records(runs["bfloat16"][1] / "metrics.jsonl")
           if r["split"] == "stats"]
  assert stats and all(math.isfinite(v) for r in stats for k, v in r.items() if "/" in k)


@pytest.mark.extended
def test_statistics_accumulate_in_float32_under_bf16_compute():
  from pergrad.model import ModelSpec
  spec = ModelSpec(n_layers=1, d_model=16, n_heads=2, d_ff=24, vocab_size=37, seq_len=8,
                   compute_dtype="bfloat16")
  params = init_params(spec, jax.random.PRNGKey(0), 8)
  tokens = jax.random.randint(jax.random.PRNGKey(1), (4, 9), 0, 37)
  batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
  loss_fn = make_loss_fn(Transformer(spec))
  for backend, gran in (("vmap", "example"), ("surgery", "example"), ("surgery", "token")):
    want = ("mean", "sq", "sign") + (("norms",) if gran == "example" else ())
    _, stats = ps.compute(loss_fn, params, batch, want=want, granularity=gran, backend=backend)
    leaves = jax.tree.leaves((stats.sum_sq, stats.sum_sign, stats.sq_norms))
    assert leaves and all(x.dtype == jnp.float32 for x in leaves), (backend, gran)


@pytest.mark.extended
def test_paper_model_at_real_width_runs_a_few_steps_on_cpu(tmp_path, tiny_overrides):
  base = [o for o in tiny_overrides if not o.startswith(("model.", "data.batch_size",
                                                          "data.eval_batch_size"))]
  plan = build_plan(compose([*base, "model=paper", "data.vocab_size=32768",
                             "data.batch_size=2", "data.eval_batch_size=2", "train.steps=2",
                             "train.eval_batches=1", "train.checkpoint_every=0",
                             "stats=example", "stats.log_every=1"]))
  m = plan.model
  assert (m.n_layers, m.d_model, m.n_heads, m.d_ff, m.vocab_size, m.seq_len) == \
      (6, 512, 8, 2048, 32768, 512) and m.compute_dtype == "bfloat16"
  summary = run(plan, tmp_path / "paper", echo=lambda s: None)
  assert summary["status"] == "completed" and math.isfinite(summary["final_train_loss"])
  assert summary["n_params"] > 50_000_000  # 6 x 512 blocks + two 32768 x 512 tables
