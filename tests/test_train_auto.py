"""One backend decision for training and library calls: `stats.backend=auto` is decided
where the model and the platform are known (`pergrad.train.plain.decided`, by
`pergrad.stats.decide`), so a model the proof refuses in part trains on the fallback
(surgery for the proven leaves, the refused position table through its example-free slice,
on CPU too), warns once, and logs the float64 loop's statistics."""

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from conftest import compose

sys.path.insert(0, str(Path(__file__).parent))
import any_models as am  # noqa: E402

from pergrad.config import build_plan  # noqa: E402
from pergrad.loss import make_loss_fn  # noqa: E402
from pergrad.model import Transformer  # noqa: E402
from pergrad.stats import api, summaries  # noqa: E402
from pergrad.stats.types import GradStats  # noqa: E402
from pergrad.train.mesh import make_mesh  # noqa: E402
from pergrad.train.step import Steps  # noqa: E402


def test_a_model_the_proof_refuses_in_part_trains_on_auto(tiny_overrides, monkeypatch):
  plan = build_plan(compose([*tiny_overrides, "stats=example", "stats.log_every=1",
                             "train.steps=2"]))
  assert plan.stats.log_backend == "auto"  # decided with the model, not before
  base = make_loss_fn(Transformer(plan.model))

  def penalised(p, b):  # a penalty on the position table inside the per-example loss
    return base(p, b) + 0.01 * jnp.sum(jnp.square(p["pos_embed"]["embedding"]))

  monkeypatch.setattr(api, "_WARNED", set())
  with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    steps = Steps(plan, make_mesh(), loss_fn=penalised)
    B, T = plan.data.batch_size, plan.data.seq_len
    tokens = np.random.default_rng(0).integers(0, plan.model.vocab_size, (B, T + 1), np.int32)
    host = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state = steps.init(np.int32(0))
    params = jax.device_get(state.params)
    state, metrics = steps.step(state, steps.put_batch(host), 1)  # a logging step
  msgs = [str(w.message) for w in seen if "surgery is not exact" in str(w.message)]
  assert len(msgs) == 1 and "pos_embed/embedding" in msgs[0], msgs
  assert steps.stats_plan.log_backend == "surgery_vmap"
  ref = am.reference64(penalised, params, host)
  f32 = lambda t: jax.tree.map(lambda a: jnp.asarray(a, jnp.float32), t)
  want = summaries.layer_summaries(GradStats(
      count=jnp.float32(B), sum=f32(ref["mean"]),
      coordinate_stats={"sq": f32(ref["sq"]), "sign": f32(ref["sign"])},
      example_stats={"norms": f32(ref["norms"])}))
  leaf = [k for k in want if "pos_embed" in k]
  assert leaf and all(k in metrics for k in want)
  for k, v in want.items():
    np.testing.assert_allclose(float(metrics[k]), float(v), rtol=2e-3, atol=1e-9, err_msg=k)
  assert np.isfinite(float(metrics["loss"]))
