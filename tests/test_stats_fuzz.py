"""A differential fuzzer of the statistics engine: exact or refused, never silently wrong.

`draw(seed)` builds a small random model, in Flax Linen, Flax NNX or plain JAX (`taps`):
tokens through an embedding or features without a token axis; 1-3 blocks of dense,
`DenseGeneral`/`LinearGeneral` (two contracted axes), `nnx.Einsum`, LayerNorm/RMSNorm with
and without scale or bias; an output layer (dense, tied `attend`, or a tie written as a raw
matmul x Eᵀ); and at most one hazard: a parameter penalty in the per-example loss, a layer
shared by two calls, the body `jax.vmap`-ed per example, a scan over stacked layers in the
frontend's own way (`lax.scan`, `nnx.scan`, `nn.scan`; its step under remat or not),
`jax.checkpoint`, or keyword inputs; and, one model in six, a way to mix examples (the
hidden state centred, sorted or cumsummed over the batch, the loss normalised by the
batch's mean loss or token count); one in four, a table looked up on ids without the
example axis (positions added to h: exact; an ALiBi-style [D, 1] table sliced: refused
alone, its leaf taken from vmap by auto). One model in three passes params nested under a
key, as its output layer's leaves alone (the rest a frozen constant closed over), or with
unused extra leaves; one in six of the others has a loss whose examples alone are not its
rows (divided by the batch's size; a dropout mask drawn for the batch). `check(seed)` runs
backends surgery, auto and vmap on it (every statistic, with and without per-example
clipping; surgery's per-token mean too) against a float64 per-example loop
(`any_models.reference64`; `batch_reference64` for those losses):

  - surgery either matches the loop or raises `Unsupported` (and refuses exactly the models
    with a hazard surgery cannot prove exact: never an accepted mismatch, never a refusal of
    a plain model, which would cost vmap's time for nothing);
  - auto and vmap always match (auto falls back to vmap where surgery refuses), but for a
    loss whose examples alone are not its rows: vmap and the loop refuse it, and auto
    where surgery does;
  - a model that mixes examples is refused as not separable by surgery, vmap, auto and
    the loop alike, and its mean gradient alone matches float64 autodiff of the mean loss.

A fixed seed set runs in the main suite; 80 seeds in the extended one (CI's budget). As a script it
writes the record README.md cites:

    python tests/test_stats_fuzz.py --models 500 --out results/stats_fuzz.json
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import time
from pathlib import Path

import jax
import pytest

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]
import any_models as am  # noqa: E402
import numpy as np  # noqa: E402
from fuzz_check import check  # noqa: E402
from fuzz_models import TABLES, build, draw, refused  # noqa: E402

from pergrad.sweep.record import provenance  # noqa: E402

# A fixed set covering every frontend, hazard and head (found by `draw`), for the main suite.
MAIN_SEEDS = (5, 14, 24, 29, 36, 38, 43, 44, 0, 13, 58, 9, 28, 52, 53, 75, 68)


@pytest.mark.parametrize("seed", MAIN_SEEDS)
def test_every_backend_is_exact_or_refused(seed):
  out = check(seed)
  assert out["mismatches"] == [], (out["model"], out["mismatches"])


def test_the_main_seeds_cover_every_frontend_hazard_and_head():
  models = [draw(s) for s in MAIN_SEEDS]
  assert {m["frontend"] for m in models} == {"plain", "nnx", "linen"}
  assert {m["tokens"] for m in models} == {True, False}
  assert {m["hazard"] for m in models} >= {"none", "keyword", "vmapped", "scan", "remat",
                                            "penalty"}
  assert {(m["frontend"], m["scan_remat"]) for m in models if m["hazard"] == "scan"} >= {
      ("plain", False), ("linen", True), ("nnx", True)}  # nn.scan, nnx.scan with remat
  assert any(m["hazard"] == "scan" and m["per_batch"] for m in models)  # clipping: refused
  assert any(refused(m) for m in models) and any(not refused(m) for m in models)
  assert {m["mixing"] for m in models} > {None}  # a model that mixes examples
  assert {m["tree"] for m in models} == {"as_is", "nested", "frozen", "extra"}
  assert {m["per_batch"] for m in models} == {None, "batch_size", "dropout"}
  assert any(m["per_batch"] and refused(m) for m in models)  # auto refuses: no backend exact
  assert {m["table"] for m in models} == {None, *TABLES}  # tables without the example axis
  assert any(m["module"] and not m["mixing"] for m in models)  # an nnx.Module as params


def test_the_round_off_allowance_passes_round_off_and_catches_more():
  """Seed 185 (the loss normalised by the batch's mean loss: ḡ = 0 on every leaf but the
  penalised one) is exact at 6·u·S, inside the allowance; a mean off by 4× the allowance on a
  leaf whose ḡ = 0, or by 1e-3 relative on any leaf, is caught."""
  assert check(185)["mismatches"] == []
  _, loss_fn, params, batch = build(185)
  per = jax.tree.map(lambda g: np.asarray(g, np.float64), jax.jacrev(loss_fn)(params, batch))
  ref = {"_samples": per, "mean": jax.tree.map(lambda g: g.sum(0), per)}
  S = max(float(np.linalg.norm(g.reshape(len(g), -1), axis=1).sum()) for g in jax.tree.leaves(per))
  allowance = am.ROUNDINGS * 2.0**-24 * S
  zero = [float(np.linalg.norm(m)) < allowance for m in jax.tree.leaves(ref["mean"])]
  assert sum(zero) >= len(zero) - 1
  for size, caught in ((lambda m: 4 * allowance, sum(zero)),
                       (lambda m: 1e-3 * (S + np.linalg.norm(m)), len(zero))):
    off = jax.tree.map(lambda m, size=size: m + size(m) / np.sqrt(m.size), ref["mean"])
    assert len(am.mismatches({"mean": off}, ref, want=("mean",))) == caught
  assert am.mismatches({"mean": ref["mean"]}, ref, want=("mean",)) == []


EXTENDED_MODELS = 80  # CI's share (its 90 minutes hold the main and extended suites); the
# committed record runs more (`--models 500`, sharded: README's sentence below)


@pytest.mark.extended
def test_models_none_silently_wrong():
  outs = [check(s) for s in range(EXTENDED_MODELS)]
  bad = [(o["model"], o["mismatches"]) for o in outs if o["mismatches"]]
  assert bad == []


RECORD = Path(__file__).resolve().parents[1] / "results" / "stats_fuzz.json"


def readme_sentence(rec: dict) -> str:
  """README.md's statement of the fuzzer's record (checked against the record below)."""
  at = (f" at commit `{rec['commit'][:7]}`" + ("" if rec.get("clean") else " (modified)")
        if "commit" in rec else "")
  return (f"Its record (`results/stats_fuzz.json`, written by `python tests/test_stats_fuzz.py "
          f"--models {rec['models']} --out results/stats_fuzz.json`, or in shards `--shard K/N` "
          f"joined by `--merge`){at}: {rec['models']} models, "
          f"{rec['surgery_exact']} proved exact and {rec['surgery_refused']} refused by surgery, "
          f"{rec['silent_mismatches']} silent mismatches"
          + ("." if "mixing" in rec else " (a run from before the fuzzer drew models that mix "
             "examples)."))


def test_the_readme_states_the_committed_record():
  rec = json.loads(RECORD.read_text())
  assert rec["models"] >= 500 and rec["silent_mismatches"] == 0 and not rec["failures"]
  readme = " ".join((RECORD.parents[1] / "README.md").read_text().split())
  assert readme_sentence(rec) in readme
  assert f"CI's extended suite runs its first {EXTENDED_MODELS} seeds." in readme


def test_a_merge_keeps_the_shards_provenance_and_names_a_mix():
  rec = json.loads(RECORD.read_text())
  halves = [dict(rec, rows=rec["rows"][k::2], failures=[], seconds=1.0) for k in (0, 1)]
  joined = merged(halves)
  assert {k: joined[k] for k in ("models", "surgery_exact", "surgery_refused", "commit", "clean")} \
      == {k: rec[k] for k in ("models", "surgery_exact", "surgery_refused", "commit", "clean")}
  mix = merged([halves[0], dict(halves[1], commit="0" * 40)])
  assert (mix["commit"], mix["clean"]) == ("mixed", False)


def summary(outs, seconds: float, prov: dict) -> dict:
  """The record of a run: counts, failures, and one row per model (seed, frontend, tokens,
  head, hazard, surgery's outcome, mismatches)."""
  count = collections.Counter
  return dict(
      models=len(outs), silent_mismatches=sum(bool(o["mismatches"]) for o in outs),
      surgery_exact=sum(o["surgery"] == "exact" for o in outs),
      surgery_refused=sum(o["surgery"] == "refused" for o in outs),
      frontends=dict(count(o["model"]["frontend"] for o in outs)),
      hazards=dict(count(o["model"]["hazard"] for o in outs)),
      mixing=dict(count(o["model"].get("mixing") or "none" for o in outs)),
      trees=dict(count(o["model"].get("tree") or "as_is" for o in outs)),
      per_batch=dict(count(o["model"].get("per_batch") or "none" for o in outs)),
      tables=dict(count(o["model"].get("table") or "none" for o in outs)),
      heads=dict(count(o["model"]["head"] for o in outs)),
      failures=[dict(seed=o["model"]["seed"], mismatches=o["mismatches"]) for o in outs
                if o["mismatches"]],
      seconds=round(seconds, 1),
      rows=[[o["model"]["seed"], o["model"]["frontend"], o["model"]["tokens"],
             o["model"]["head"], o["model"]["hazard"], o["surgery"], len(o["mismatches"]),
             o["model"].get("mixing"), o["model"].get("tree"), o["model"].get("per_batch"),
             o["model"].get("table")]
            for o in outs],
      command="python tests/test_stats_fuzz.py --models N --out results/stats_fuzz.json",
      **prov)  # the commit the record was run at, and whether the tree was clean


def merged(records: list[dict]) -> dict:
  """One record of runs over disjoint seeds (`--shard`), as one run's."""
  outs = [dict(model=dict(seed=r[0], frontend=r[1], tokens=r[2], head=r[3], hazard=r[4],
                          mixing=r[7] if len(r) > 7 else None,
                          tree=r[8] if len(r) > 8 else None,
                          per_batch=r[9] if len(r) > 9 else None,
                          table=r[10] if len(r) > 10 else None),
               surgery=r[5], mismatches=["?"] * r[6]) for rec in records for r in rec["rows"]]
  commits = {(r.get("commit"), r.get("clean")) for r in records}
  commit, clean = commits.pop() if len(commits) == 1 else ("mixed", False)
  rec = summary(sorted(outs, key=lambda o: o["model"]["seed"]),
                sum(r["seconds"] for r in records), {"commit": commit, "clean": clean})
  rec["failures"] = [f for r in records for f in r["failures"]]
  return rec


def _crashed(seed: int, e: Exception) -> dict:
  return dict(model=draw(seed), surgery="crash", mismatches=[f"{type(e).__name__}: {e}"])


if __name__ == "__main__":
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--models", type=int, default=500)
  ap.add_argument("--shard", default="0/1", help="K/N: the seeds s < models with s %% N == K")
  ap.add_argument("--merge", type=Path, nargs="*", help="merge these shards' records into --out")
  ap.add_argument("--out", type=Path, default=None)
  a = ap.parse_args()
  if a.merge:
    rec = merged([json.loads(f.read_text()) for f in a.merge])
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
    sys.exit(print({k: v for k, v in rec.items() if k != "rows"}))
  k, n = map(int, a.shard.split("/"))
  t0, outs, prov = time.time(), [], provenance()  # the commit at the start of the run
  for s in range(k, a.models, n):
    try:
      outs.append(check(s))
    except Exception as e:  # noqa: BLE001 - recorded as a failure, the run goes on
      outs.append(_crashed(s, e))
    build.cache_clear()
    jax.clear_caches()
    if a.out and len(outs) % 10 == 0:  # the record so far: a stopped run keeps its count
      a.out.write_text(json.dumps(summary(outs, time.time() - t0, prov), indent=1) + "\n")
      print(len(outs), sum(bool(o["mismatches"]) for o in outs), f"{time.time() - t0:.0f}s",
            flush=True)
  rec = summary(outs, time.time() - t0, prov)
  print(json.dumps(rec, indent=1))
  if a.out:
    a.out.write_text(json.dumps(rec, indent=1) + "\n")
