"""Plain steps: programs that compute the batch gradient ḡ and nothing else.

The statistics benchmark divides by the FASTEST of them (`pergrad.bench.paired.fastest`),
so that a variant cannot look cheap against a slow baseline. Candidates, each
fn(params, batch) -> (mean loss, GradStats with sum = B·ḡ):
  value_and_grad  `jax.value_and_grad` of the mean loss (plain autodiff);
  surgery         the surgery backend asked for "mean" alone (called directly: `compute`
                  would route such a request to value_and_grad); with no statistic asked
                  it intercepts every layer call but runs each untouched;
  contraction     the "contraction" backend (`surgery.contraction_stats`): each dense
                  layer's kernel gradient as one contraction Aᵀ Δ over (example, row)
                  (`surgery.dense.contracted`), each normalization layer's backward from
                  the x̂ kept (`surgery.norm.simultaneous_norm`), no statistic asked.
`choose_baseline` checks that they agree leaf by leaf (`same_gradient`) before anything
is timed and drops duplicates of one XLA program (`program_key`).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import jax
import numpy as np

from pergrad.stats import surgery
from pergrad.stats.backends import value_and_grad_stats
from pergrad.stats.options import StatsOptions
from pergrad.stats.request import StatsRequest

NAMES = ("value_and_grad", "surgery", "contraction")


def candidates(loss_fn) -> list[tuple[str, object]]:
  """[(name, fn(params, batch) -> (loss, GradStats))] for every name of NAMES."""
  request, options = StatsRequest(), StatsOptions()
  return [
      ("value_and_grad", lambda p, b: value_and_grad_stats(loss_fn, p, b, request, options)),
      ("surgery", lambda p, b: surgery.surgery_stats(loss_fn, p, b, request, options)),
      ("contraction", lambda p, b: surgery.contraction_stats(loss_fn, p, b, request, options)),
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
