"""The fuzzer's check: one drawn model (`fuzz_models.build`) run on every backend against the
float64 per-example loop (`any_models.reference64`); see `tests/test_stats_fuzz.py`."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

sys.path.insert(0, str(Path(__file__).parent))
import any_models as am  # noqa: E402
from fuzz_models import ALL, B, T, build, refused  # noqa: E402

import pergrad.stats as ps  # noqa: E402
from pergrad.stats.surgery import Unsupported  # noqa: E402


def check(seed: int) -> dict:
  """The outcome of one model: {"model", "surgery": "exact" | "refused", "expected",
  "mismatches": [...]} (module docstring); mismatches is empty unless something is wrong."""
  m, loss_spec, params, batch = build(seed)
  if m["mixing"]:
    return dict(model=m, surgery="refused", mismatches=_refused_everywhere(
        reference_loss(loss_spec), params, batch))
  alone = not m.get("per_batch")  # each example's loss alone is its row: vmap may serve it
  ref = (am.reference64 if alone else am.batch_reference64)(reference_loss(loss_spec), params,
                                                            batch)
  norms = np.sqrt(sum(np.square(g).reshape(B, -1).sum(-1)
                      for g in jax.tree.leaves(ref["_samples"])))
  C = float(np.median(norms))
  cref = am.statistics64(ref["_samples"], clip=C)
  call = lambda p, b, **kw: ps.compute(*as_module(loss_spec, p), b, **kw)
  accepted = _accepts(call, params, batch, "surgery")
  bad = [f"surgery {'accepted' if accepted else 'refused'} it"] * (accepted == refused(m))
  if not alone:  # vmap and the loop refuse it, and auto where surgery does
    for be in ("vmap", "loop") + ("auto",) * (not accepted):
      if _accepts(call, params, batch, be, "alone" if be != "auto" else "no backend"):
        bad.append(f"{be} did not refuse a loss whose examples alone are not its rows")
  # Clipped: by vmap where examples alone are rows, else by surgery where it clips (not
  # through a scan or remat): elsewhere auto refuses it.
  clip_call = lambda p, b, **kw: call(p, b, per_example_clip=C, **kw)
  clipped = alone or (accepted and _accepts(clip_call, params, batch, "surgery", "clipping"))
  if not clipped and _accepts(clip_call, params, batch, "auto", "no backend"):
    bad.append("auto clipped a loss that no backend clips exactly")
  # auto is surgery where surgery accepts (then vmap is checked beside it), vmap elsewhere.
  runs = {f"{be}/{clip}": (be, clip) for be in ("auto",) * (alone or accepted)
          + ("vmap",) * (accepted and alone) for clip in (None, C)[:1 + clipped]}

  def every(p, b):
    out = {k: call(p, b, want=ALL, backend=be, per_example_clip=clip)[1]
           for k, (be, clip) in runs.items()}
    out["auto/mean"] = call(p, b)[1]
    if accepted and m["tokens"]:
      out["surgery/token"] = call(p, b, want=("mean", "sq"), granularity="token",
                                  backend="surgery")[1]
    return out

  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    got = jax.jit(every).lower(params, batch).compile(FAST_COMPILE)(params, batch)
  for k, stats in got.items():
    if k == "surgery/token":  # the per-token samples' mean is ḡ: their sum is T·Σ_b g_b
      mean = {"_samples": ref["_samples"], "mean": jax.tree.map(lambda s: s * T, ref["mean"])}
      errs = am.mismatches(stats, mean, want=("mean",))
    elif k == "auto/mean":
      errs = am.mismatches(stats, ref, want=("mean",))
    else:
      errs = am.mismatches(stats, ref if k.endswith("None") else cref)
    bad += [f"{k}: {e}" for e in errs]
  return dict(model=m, surgery="exact" if accepted else "refused", mismatches=bad)


def _accepts(call, params, batch, backend: str, words: str = "") -> bool:
  """Whether `backend` accepts the model, `call`(params, batch, **compute's keywords)
  (traced, as in a training step); an `Unsupported` without `words` in it is raised."""
  try:
    with warnings.catch_warnings():
      warnings.simplefilter("ignore")
      jax.eval_shape(lambda p, b: call(p, b, want=ALL, backend=backend), params, batch)
    return True
  except Unsupported as e:
    if words not in str(e):
      raise
    return False


def _refused_everywhere(loss_fn, params, batch) -> list[str]:
  """A model that mixes examples: every backend refuses it as not separable (traced, as in
  a training step), and its mean gradient alone is the float64 gradient of the mean loss."""
  bad = []
  for be in ("surgery", "vmap", "auto", "loop"):
    try:
      jax.eval_shape(lambda p, b, be=be: ps.compute(loss_fn, p, b, want=ALL, backend=be),
                     params, batch)
      bad.append(f"{be} accepted a model that mixes examples")
    except Unsupported as e:
      if "not separable" not in str(e):
        bad.append(f"{be} refused it for another reason: {e}")
  got = jax.jit(lambda p, b: ps.compute(loss_fn, p, b)[1])(params, batch)
  with jax.enable_x64(True):  # ∂ℓ_b/∂θ in float64; Σ_b = B ∇ mean loss (0 for ℓ_b / mean ℓ)
    per = jax.tree.map(np.asarray, jax.jacrev(lambda p: loss_fn(p, batch).astype(
        jnp.float64))(jax.tree.map(lambda a: np.asarray(a, np.float64), params)))
  ref = {"_samples": per, "mean": jax.tree.map(lambda g: g.sum(0), per)}
  return bad + [f"auto/mean: {e}" for e in am.mismatches(got, ref, want=("mean",))]


# XLA:CPU options that compile ~the same program several times faster (its speed is moot).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def as_module(loss_fn, params):
  """(loss_fn, params) as `compute` takes them: a module-style NNX model's (loss of the
  module, graph) and state give (loss, the merged module); others unchanged."""
  if isinstance(loss_fn, tuple):
    fn, graphdef = loss_fn
    return fn, nnx.merge(graphdef, params)
  return loss_fn, params


def reference_loss(loss_fn):
  """A (params, batch) loss for the float64 reference: a module-style model merged."""
  if isinstance(loss_fn, tuple):
    fn, graphdef = loss_fn
    return lambda p, b: fn(nnx.merge(graphdef, p), b)
  return loss_fn
