"""Plain steps: programs that compute the batch gradient ḡ and nothing else.

The statistics benchmark divides by the FASTEST of them (`pergrad.bench.paired.fastest`),
so that a variant cannot look cheap against a slow baseline. Candidates, each
fn(params, batch) -> (mean loss, GradStats with sum = B·ḡ):
  value_and_grad  `jax.value_and_grad` of the mean loss (plain autodiff);
  surgery         the surgery backend asked for "mean" alone (called directly: `compute`
                  would route such a request to value_and_grad); with no statistic asked
                  it intercepts every layer call but runs each untouched;
  contraction     the parameter gradients as the surgery simultaneous method forms them,
                  without per-example axes: each dense layer's custom VJP takes the kernel
                  gradient as one contraction Aᵀ Δ over the B×R×K and B×R×L row layouts
                  of `surgery.tap.rows` (einsum brk,brl->kl, float32 accumulation), each
                  normalization layer runs `surgery.norm.simultaneous_norm`'s backward
                  (x̂ kept from the forward pass) with no statistic asked.
`choose_baseline` checks that they agree leaf by leaf (`same_gradient`) before anything
is timed and drops duplicates of one XLA program (`program_key`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np

from pergrad.stats import surgery
from pergrad.stats.backends import value_and_grad_stats
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest
from pergrad.stats.surgery import dense, frontends, norm, sites
from pergrad.stats.surgery.sites import make_plan
from pergrad.stats.surgery.tap import F32, Call, Env
from pergrad.stats.types import GradStats

NAMES = ("value_and_grad", "surgery", "contraction")


def _contracted_dense(layer, site, B: int, x):
  """y of a dense call whose kernel gradient is one contraction over (example, row)."""
  kernel, bias = layer.params["kernel"], layer.params.get("bias")
  fwd = lambda x_, k_, b_: layer.forward(x_, {"kernel": k_, "bias": b_})

  @jax.custom_vjp
  def f(x_, k_, b_):
    return fwd(x_, k_, b_)

  def f_fwd(x_, k_, b_):
    return fwd(x_, k_, b_), (x_, k_, b_)

  def f_bwd(res, dy):
    _, k_, b_ = res
    dx, a_BxRxK, d_BxRxL = dense.backward_rows(fwd, site, B, res, dy)
    dk = jnp.einsum("brk,brl->kl", a_BxRxK, d_BxRxL, preferred_element_type=F32)
    db = (None if b_ is None
          else d_BxRxL.astype(F32).sum(axis=(0, 1)).reshape(b_.shape).astype(b_.dtype))
    return dx, dk.reshape(k_.shape).astype(k_.dtype), db

  f.defvjp(f_fwd, f_bwd)
  return f(x, kernel, bias)


def contraction_stats(loss_fn, params, batch):
  """Mean loss and GradStats("mean") by the contraction step (module docstring)."""
  plan = make_plan(loss_fn, params, batch, StatsRequest())
  B = plan.B
  env = Env(B=B, token=False, want=(), scale=float(B), options=StatsOptions(),
            sites=plan.sites)

  def objective(p):
    def handler(site, layer):
      if site.kind == "dense" and site.in_axis is not None and site.plain_dot:
        return _contracted_dense(layer, site, B, layer.x)
      if site.kind == "norm" and site.in_axis is not None:
        return norm.simultaneous_norm(env, Call(site=site, layer=layer, probes={}))
      return layer.run()

    with frontends.route(sites.site_router(plan, p, handler)):
      return loss_fn(p, batch).mean()

  loss, grads = jax.value_and_grad(objective)(params)
  return loss, GradStats(count=jnp.asarray(B, F32),
                         sum=jax.tree.map(lambda g: g.astype(F32) * B, grads))


def candidates(loss_fn) -> list[tuple[str, object]]:
  """[(name, fn(params, batch) -> (loss, GradStats))] for every name of NAMES."""
  request, options = StatsRequest(), StatsOptions()
  return [
      ("value_and_grad", lambda p, b: value_and_grad_stats(loss_fn, p, b, request, options)),
      ("surgery", lambda p, b: surgery.surgery_stats(loss_fn, p, b, request, options)),
      ("contraction", lambda p, b: contraction_stats(loss_fn, p, b)),
  ]


def same_gradient(ref, other, rtol: float = 1e-4) -> list[str]:
  """Paths of the leaves where two (loss, GradStats) outputs' sums differ: |a - b| ≤
  rtol·(|b| + max|b|) elementwise fails (empty: the same gradient)."""
  bad = []
  flat_ref = jax.tree_util.tree_flatten_with_path(ref[1].sum)[0]
  flat_other = jax.tree.leaves(other[1].sum)
  for (path, b), a in zip(flat_ref, flat_other, strict=True):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    if a.shape != b.shape or not np.allclose(a, b, rtol=rtol,
                                             atol=rtol * float(np.abs(b).max(initial=0.0))):
      bad.append(jax.tree_util.keystr(path))
  return bad


_METADATA = re.compile(r",? ?metadata=\{[^}]*\}")


def program_key(compiled) -> str:
  """The optimized HLO's computations without source metadata (module name, file and
  function tables, op metadata): equal keys, the same program."""
  lines = (compiled.as_text() or "").splitlines()
  start = next((i for i, s in enumerate(lines) if s.startswith(("%", "ENTRY"))), len(lines))
  return _METADATA.sub("", "\n".join(lines[start:]))


def choose_baseline(cands: list[dict], outs: dict, rtol: float = 1e-4,
                    key: Callable | None = None) -> list[dict]:
  """The distinct plain programs among `cands` ({"name", "compiled"}), after checking that
  each computes the first one's gradient (`outs[name]`: its output); a candidate whose
  program (`key(compiled)`) equals an earlier one's gets `same_program_as` and is not
  timed (`key`: `program_key` unless given). ValueError (naming the leaves) if a
  candidate's gradient differs."""
  key = program_key if key is None else key
  ref = outs[cands[0]["name"]]
  seen = {}
  for cand in cands:
    bad = same_gradient(ref, outs[cand["name"]], rtol)
    if bad:
      raise ValueError(f"baseline candidate {cand['name']!r} computes another gradient than "
                       f"{cands[0]['name']!r} at {bad[:3]}; fix it or drop it from "
                       "pergrad.bench.baselines.candidates.")
    k = key(cand["compiled"])
    cand["same_program_as"] = seen.get(k)
    seen.setdefault(k, cand["name"])
  return [c for c in cands if c["same_program_as"] is None]
