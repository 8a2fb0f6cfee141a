"""preconditioner and msq_eps on constructed runs and CSVs (no training): the ln V
divergence rule in the lr search, selection on two seeds, each variant at its chosen ε,
and msq_eps's verdict against Adam and the ε-only control with eps_share."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import as_planned

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import lr_search, msq_eps, preconditioner  # noqa: E402
from pergrad.analysis.runs import read_csv, run_dirname  # noqa: E402
from pergrad.sweep import (  # noqa: E402
  WARMUP,
  Block,
  LrSearch,
  Sweep,
  best_lr,
  follow_up_blocks,
  growth,
  marked_finals,
)
from pergrad.sweep.record import Inputs, Runs  # noqa: E402

INF = math.inf
LN_V = math.log(1024)  # the cpu preset's BPE vocabulary
CPU = {"experiment": "preconditioner", "scale": "cpu"}
W = WARMUP


def _table(runs: dict) -> pd.DataFrame:
  """A long metrics table: point -> eval losses at steps 0, 50, 100, ... (train loss alike)."""
  rows = []
  for point, evals in runs.items():
    point = dict(point)
    for i, loss in enumerate(evals):
      rows.append({"run": run_dirname(point), "status": "completed", **point, "step": 50 * i,
                   "eval/loss": loss, "train/loss": loss})
  return pd.DataFrame(rows)


def _point(variant, eps, lr, seed, clip=None) -> tuple:
  return (("optimizer.variant", variant), ("optimizer.clip_norm", clip),
          ("optimizer.eps", eps), ("optimizer.lr", lr), ("train.seed", seed))


def test_a_loss_above_ln_v_counts_as_diverged_in_the_search(tmp_path):
  # MicroAdamMSQ at ε = 1e-5 ends at 35 / 17,368 / 40,971 nats: finite, but above ln V.
  runs = {_point("micro_adam_msq", 1e-5, lr, s): [7.5, 5.0, end]
          for lr, end in ((1e-3, 35.2), (3e-3, 17368.0), (1e-2, 40971.0))
          for s in preconditioner.SELECT}
  runs |= {_point("micro_adam_msq", 1e-4, lr, s): [7.5, 5.0, 4.0 + abs(math.log10(lr / 3e-3))]
           for lr in (1e-3, 3e-3, 1e-2) for s in preconditioner.SELECT}
  runs |= {_point("micro_adam_msq", 1e-4, 3e-3, s): [7.5, 5.0, 4.0 + 0.001 * s]
           for s in preconditioner.SEEDS}
  # ε = 1e-3 trains worse than 1e-4 (MSQ's ε is a floor of √v): 1e-4 is bracketed
  runs |= {_point("micro_adam_msq", 1e-3, lr, s): [7.5, 5.0, 4.2 + abs(math.log10(lr / 3e-3))]
           for lr in (1e-3, 3e-3, 1e-2) for s in preconditioner.SELECT}
  runs |= {_point("adam", 1e-8, 3e-3, s): [7.5, 5.0, 4.1 + 0.001 * s]
           for s in (*preconditioner.SELECT, *preconditioner.SEEDS)}
  runs |= {_point("adam", 1e-8, lr, s): [7.5, 5.0, 4.3] for lr in (1e-3, 1e-2)
           for s in preconditioner.SELECT}
  runs |= {_point("micro_adam", 1e-8, lr, s): [7.5, 5.0, 4.3 + 0.01 * s + (lr != 3e-3) * 0.1]
           for lr in (1e-3, 3e-3, 1e-2) for s in preconditioner.SELECT}
  runs |= {_point("micro_adam", 1e-8, 3e-3, s): [7.5, 5.0, 4.3 + 0.001 * s]
           for s in preconditioner.SEEDS}
  table = _table(runs)
  fin = marked_finals(table, CPU)
  msq5 = fin[fin["optimizer.eps"] == 1e-5]
  assert msq5["diverged"].all() and (msq5["final_eval_loss"] == INF).all()
  assert not fin[fin["optimizer.eps"] != 1e-5]["diverged"].any()
  # A spike above ln V after the run was below it diverges too, even if it recovers.
  spike = marked_finals(_table({_point("adam", 1e-8, 0.1, 0): [7.5, 5.0, 9.0, 4.5]}),
                                  CPU)
  assert spike["diverged"].all()

  out = tmp_path / "pc"
  out.mkdir()
  for r in fin["run"]:  # each run's warmup, as Hydra records its config
    (out / r / ".hydra").mkdir(parents=True)
    (out / r / ".hydra" / "config.yaml").write_text("schedule:\n  warmup_steps: 20\n")
  preconditioner.analyze(Runs(out, table, fin, preconditioner.sweep("cpu")), out)
  assert (read_csv(out / "finals.csv")[WARMUP] == 20).all()
  best = read_csv(out / "best.csv")
  assert set(best["select_seed"]) == {"0 1"}  # the mean of both selection seeds
  msq = best[best["optimizer.variant"] == "micro_adam_msq"].set_index("optimizer.eps")
  assert msq.loc[1e-5, "all_diverged"] and not msq.loc[1e-4, "all_diverged"]
  assert msq.loc[1e-4, "fresh_seeds"] == "2 3 4 5 6"
  chosen = preconditioner.chosen(lr_search.load_best(out))
  assert dict(zip(chosen["optimizer.variant"], chosen["optimizer.eps"], strict=True)) == {
      "micro_adam_msq": 1e-4, "adam": 1e-8, "micro_adam": 1e-8}
  rep = preconditioner.report(as_planned(out))
  assert rep.rule == preconditioner.RULE and "√2 grid" in rep.rule
  assert "micro_adam_msq: 4.004 ± 0.0016 (n=5)" in rep.finding  # at ε = 1e-4, seeds 2-6
  assert "micro_adam_msq beats micro_adam" in rep.finding and rep.rule_verdict == "reproduced"
  # ...but ε = 1e-4 was chosen over 1e-5, which diverged at every lr: not a measured optimum
  assert rep.verdict == "undetermined: bracketed" and "chosen over ε ['1e-05']" in rep.guards_text()
  assert "Diverged at every lr: ['micro_adam_msq (lr 0.01 down to 0.001)']" in rep.finding
  assert "| micro_adam_msq | n/a | 1e-05 |" in rep.numbers_md  # the ε not chosen is shown
  every = lr_search.load_best(out)
  edge = preconditioner.eps_bracketed(every[every["optimizer.eps"] != 1e-3],
                                      preconditioner.chosen(every))
  assert not edge.ok and "micro_adam_msq's ε 0.0001 is the highest" in edge.why


def test_lr_is_chosen_on_the_mean_of_two_selection_seeds():
  g = {"optimizer.placement": "ema"}
  rows = [{**g, "optimizer.lr": lr, "train.seed": s, "final_eval_loss": v, "status": "completed"}
          for lr, s, v in ((1e-3, 0, 4.00), (1e-3, 1, 4.40), (3e-3, 0, 4.05), (3e-3, 1, 4.10),
                           (1e-2, 0, 4.50), (1e-2, 1, 4.50), (3e-3, 2, 4.2), (3e-3, 3, 4.3),
                           (1e-3, 2, 3.0))]
  fin = pd.DataFrame(rows)
  best = best_lr(fin, ("optimizer.placement",), "optimizer.lr", select_seed=(0, 1))
  r = best.iloc[0]
  assert r["optimizer.lr"] == 3e-3  # seed 0 alone would pick 1e-3
  assert r["select_loss"] == pytest.approx(4.075) and r["fresh_seeds"] == "2 3"
  assert r["loss_mean"] == pytest.approx(4.25) and not r["at_edge"]
  # The follow-ups run both selection seeds at an extended lr, fresh seeds at a settled one.
  sw = Sweep({}, (Block({**{k: [v] for k, v in g.items()}, "optimizer.lr": [1e-3, 3e-3],
                         "train.seed": [0, 1]}),),
             LrSearch(("optimizer.placement",), max_extend=1, seeds=(2, 3)))
  assert growth.select_seeds(sw) == (0, 1)
  blocks, kind = follow_up_blocks(sw, fin[fin["optimizer.lr"] < 5e-3])
  assert kind == "extend" and blocks[0].grid["train.seed"] == [0, 1]
  assert blocks[0].grid["optimizer.lr"] == [0.009]


# --------------------------------------------------------------------------- msq_eps


def _precond_best(tmp_path, edge_eps=()) -> Path:
  """preconditioner/best.csv beside msq_eps's report, as its search writes it: MicroAdamMSQ at
  ε = 1e-4, lr 1e-2 chosen over ε 1e-5 and 1e-3, Adam at lr 3e-2, each lr bracketed; the εs in
  `edge_eps` with their lr at the grid's top edge instead."""
  rows = [{"optimizer.variant": v, "optimizer.clip_norm": None, "optimizer.eps": e,
           "optimizer.lr": lr, "select_seed": 0, "select_loss": x, "fresh_losses": f"{x}",
           "at_edge": e in edge_eps, "all_diverged": False, "diverged_lrs": None,
           "grid": " ".join(f"{lr * k:g}" for k in ((0.25, 0.5, 1) if e in edge_eps
                                                  else (0.5, 1, 2))), "warmup_steps": 20}
          for v, e, lr, x in (("micro_adam_msq", 1e-4, 1e-2, 4.0), ("micro_adam_msq", 1e-5,
                              1e-2, 4.1), ("micro_adam_msq", 1e-3, 1e-2, 4.2),
                              ("adam", 1e-8, 3e-2, 4.0))]
  out = tmp_path / preconditioner.NAME
  out.mkdir(exist_ok=True)
  pd.DataFrame(rows).to_csv(out / "best.csv", index=False)
  return out


def test_an_eps_chosen_over_one_whose_lr_search_ended_at_an_edge_is_not_bracketed(tmp_path):
  # ε = 1e-3's loss is an upper bound (its best lr may lie past the edge): it might beat 1e-4.
  for edge, ok in (((), True), ((1e-3,), False)):
    every = lr_search.load_best(_precond_best(tmp_path, edge))
    g = preconditioner.eps_bracketed(every, preconditioner.chosen(every))
    assert g.ok == ok and g.name == "bracketed", g.why
  assert "ε 0.0001 was chosen over ε ['0.001'], whose lr searches ended at a grid edge" in g.why
  # msq_eps runs at that choice: it inherits the guard, and without the preconditioner's
  # search beside it nothing vouches for its ε and lrs.
  rep = msq_eps.report(as_planned(_msq_out(tmp_path, MSQ, TIGHT, CTRL, matched=CTRL)))
  assert rep.verdict == "undetermined: bracketed", rep.finding
  assert "preconditioner's search: micro_adam_msq's ε 0.0001 was chosen" in rep.guards_text()
  _precond_best(tmp_path)
  assert msq_eps.report(as_planned(tmp_path / "me")).verdict != "undetermined: bracketed"
  # ...for the arms it ran only: a preconditioner search re-run since, choosing another lr
  best = read_csv(tmp_path / preconditioner.NAME / "best.csv")
  best.loc[best["optimizer.variant"] == "adam", "optimizer.lr"] = 0.06
  best.to_csv(tmp_path / preconditioner.NAME / "best.csv", index=False)
  rep = msq_eps.report(as_planned(tmp_path / "me"))
  assert rep.verdict == "undetermined: bracketed"
  assert "this sweep ran [('adam', '1e-08', '0.03')]" in rep.guards_text()
  (tmp_path / preconditioner.NAME / "best.csv").unlink()
  rep = msq_eps.report(as_planned(tmp_path / "me"))
  assert rep.verdict == "undetermined: bracketed"
  assert "no preconditioner/best.csv" in rep.guards_text()


def _msq_out(tmp_path, msq, adam, control, share_msq=0.9, matched=None) -> Path:
  """finals.csv, best.csv and eps_share.csv as msq_eps.analyze writes them: MicroAdamMSQ and
  Adam fixed on the fresh seeds, the ε-only control (and the ε-matched one, Adam at
  MicroAdamMSQ's ε = 1e-4, when `matched`) searched on the selection seed 0."""
  rows = []
  fixed = (("micro_adam_msq", 1e-4, 1e-2, msq), ("adam", 1e-8, 3e-2, adam))
  for v, eps, lr, vals in fixed:
    rows += [{"optimizer.variant": v, "optimizer.eps": eps, "optimizer.lr": lr,
              "train.seed": s, "final_eval_loss": x, "status": "completed", W: 20}
             for s, x in zip(msq_eps.SEEDS, vals, strict=False)]
  for eps, vals in ((1.0, control), (1e-4, matched)):
    if vals is None:
      continue
    ctrl = {"optimizer.variant": "adam", "optimizer.eps": eps}
    rows += [{**ctrl, "optimizer.lr": lr, "train.seed": s, "final_eval_loss": x0,
              "status": "completed", W: 20}
             for lr, x0 in ((0.3, 4.6), (1.0, min(vals)), (3.0, 4.7)) for s in msq_eps.SELECT]
    rows += [{**ctrl, "optimizer.lr": 1.0, "train.seed": s, "final_eval_loss": x,
              "status": "completed", W: 20} for s, x in zip(msq_eps.SEEDS, vals, strict=False)]
  if not (tmp_path / preconditioner.NAME / "best.csv").exists():
    _precond_best(tmp_path)  # the search that chose MicroAdamMSQ's ε and lr, Adam's lr
  out = tmp_path / "me"
  out.mkdir(exist_ok=True)
  fin = pd.DataFrame(rows)
  fin.to_csv(out / "finals.csv", index=False)
  best_lr(fin, msq_eps.GROUP, "optimizer.lr", select_seed=msq_eps.SELECT).to_csv(
      out / "best.csv", index=False)
  pd.DataFrame([{"optimizer.variant": v, "optimizer.eps": e, "train.seed": s, "eps_share": sh}
                for v, e, sh in (("micro_adam_msq", 1e-4, share_msq), ("adam", 1e-8, 0.01),
                                 ("adam", 1.0, 1.0)) for s in msq_eps.SEEDS]).to_csv(
      out / "eps_share.csv", index=False)
  return out


def test_msq_eps_msq_like_momentum_is_partly_reproduced(tmp_path):
  rep = msq_eps.report(as_planned(_msq_out(tmp_path, MSQ, TIGHT, MSQ)))
  assert rep.verdict == "partly reproduced" and rep.rule == msq_eps.RULE
  assert "micro_adam_msq, eps=0.0001 is non-inferior to adam, eps=1e-08" in rep.finding
  assert "micro_adam_msq, eps=0.0001 is equivalent to control (adam, eps=1)" in rep.finding
  assert "eps_share" in rep.numbers_md and "| 0.900 |" in rep.numbers_md
  assert "Declared before the run: margin 0.02 (nats:" in rep.finding
  cal = rep.calibrations["micro_adam_msq, eps=0.0001 vs adam, eps=1e-08"]
  assert cal["kind"] == "paired" and cal["false_alarm"] <= 0.055 and cal["power"] >= 0.8


# the fresh seeds 2-6 (the preconditioner's first look: 5 seeds)
TIGHT = [4.000, 4.001, 4.002, 4.001, 4.000]  # Adam's
MSQ = [4.001, 4.002, 4.003, 4.002, 4.001]
CTRL = [4.300, 4.301, 4.302, 4.301, 4.300]
NOISY = [4.00, 4.02, 4.04, 4.02, 4.00]


@pytest.mark.parametrize(("msq", "adam", "control", "matched", "verdict"), [
    (MSQ, TIGHT, CTRL, CTRL, "reproduced"),  # within the margin, beats both
    (MSQ, TIGHT, CTRL, MSQ, "partly reproduced"),  # Adam at MSQ's ε as good: ε can explain it
    ([4.200, 4.201, 4.202, 4.201, 4.200], TIGHT, CTRL, None, "not reproduced"),  # beyond margin
    ([4.01, 4.05, 4.01, 4.05, 4.03], NOISY, CTRL, CTRL,  # paired gaps 0.014 ± 0.026: neither
     msq_eps.INCONCLUSIVE),  # within 0.02 nor beyond it at 5 seeds
    ([4.20, 4.21, 4.22, 4.21, 4.20], NOISY, CTRL, None,
     "not reproduced"),  # a loss detected on the paired gaps: it stands at any power
    ([4.01, INF, 4.05, 4.03, 4.02], TIGHT, CTRL, None, "undetermined: stable"),  # diverged
    ([4.01], NOISY, CTRL, None, msq_eps.INCONCLUSIVE),  # one shared seed: no interval
])
def test_msq_eps_verdicts(tmp_path, msq, adam, control, matched, verdict):
  rep = msq_eps.report(as_planned(_msq_out(tmp_path, msq, adam, control, 0.1, matched)))
  assert rep.verdict == verdict, rep.finding
  assert rep.calibration["effect"] == msq_eps.MARGIN.value == msq_eps.EFFECT.value
  if matched is not None:
    assert "vs adam, eps=0.0001" in rep.ours  # the ε-matched control is judged


@pytest.mark.parametrize("drop, verdict", [(None, "reproduced"), (3, "undetermined: pilot")])
def test_an_arm_past_its_pilot_is_read_only_when_the_pilot_comes_first(tmp_path, drop, verdict):
  """The ε-only control gets seeds 7 and 8 past its pilot (seeds 2-6): read as a two-stage test
  when every pilot seed is there; with pilot seed 3 missing the rule would read seed 7 as part
  of the pilot, so the `pilot` guard fires."""
  five = [4.001, 4.002, 4.003, 4.002, 4.001]
  out = _msq_out(tmp_path, five, [x - 0.001 for x in five], [x + 0.3 for x in five],
                 matched=[x + 0.3 for x in five])
  fin = read_csv(out / "finals.csv")
  ctrl = (fin["optimizer.eps"] == 1.0) & (fin["optimizer.lr"] == 1.0)
  added = fin[ctrl & (fin["train.seed"] == 2)]
  fin = pd.concat([fin, added.assign(**{"train.seed": [7]}), added.assign(**{"train.seed": [8]})],
                  ignore_index=True)
  if drop is not None:
    fin = fin[~((fin["optimizer.eps"] == 1.0) & (fin["train.seed"] == drop))]
  fin.to_csv(out / "finals.csv", index=False)
  best_lr(fin, msq_eps.GROUP, "optimizer.lr", select_seed=msq_eps.SELECT).to_csv(
      out / "best.csv", index=False)
  rep = msq_eps.report(as_planned(out))
  assert rep.verdict == verdict, rep.finding
  pilot = next(g for g in rep.guards if g["name"] == "pilot")
  assert pilot["ok"] == (drop is None)
  assert pilot["why"] == ("control (adam, eps=1)'s first seeds are [2, 4, 5, 6, 7], not the pilot "
                          "[2, 3, 4, 5, 6]" if drop else
                          "every arm past the pilot starts with its 5 seeds (1 of 4 arms past it)")


def test_msq_eps_at_the_margin_is_inconclusive_and_says_why(tmp_path):
  """MicroAdamMSQ 0.02 worse than Adam, to ± 0.002: neither shown within the margin nor
  beyond it, a verdict that says so (every guard passing)."""
  out = _msq_out(tmp_path, [4.020, 4.021, 4.022, 4.021, 4.020], TIGHT, CTRL, matched=CTRL)
  rep = msq_eps.report(as_planned(out))
  assert rep.verdict == msq_eps.INCONCLUSIVE, rep.finding
  assert rep.verdict.startswith("undetermined: ") and all(g["ok"] for g in rep.guards)


def test_msq_eps_without_adam_is_undetermined(tmp_path):
  rep = msq_eps.report(as_planned(_msq_out(tmp_path, [4.0, 4.1], [], [4.3, 4.3, 4.3])))
  assert rep.verdict == msq_eps.INCONCLUSIVE and "is not separable from adam" in rep.finding


def test_eps_share_table_averages_the_logged_steps():
  t = pd.DataFrame({"run": ["a"] * 3 + ["b"] * 3, "optimizer.variant": "micro_adam_msq",
                    "optimizer.eps": 1e-4, "optimizer.lr": 1e-2,
                    "train.seed": [2] * 3 + [3] * 3, "step": [1, 50, 51] * 2,
                    "opt/all/eps_share": [0.8, 0.6, None, 0.5, 0.7, None],
                    "opt/block_0/mlp/kernel/eps_share": [1.0, 0.0, None, 0.5, 0.5, None]})
  out = msq_eps.eps_share(t).set_index("train.seed")
  assert out.loc[2, "eps_share"] == pytest.approx(0.7)
  assert out.loc[3, "block_0/mlp/kernel/eps_share"] == pytest.approx(0.5)


def _fake_run(d: Path, point: dict, loss: float) -> None:
  rd = d / run_dirname(point)
  rd.mkdir(parents=True)
  recs = [{"step": s, "split": sp, "loss": x} for s, x in ((0, 7.5), (400, loss))
          for sp in ("train", "eval")]
  (rd / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
  (rd / "summary.json").write_text(json.dumps({"status": "completed"}))


def test_msq_eps_runs_at_the_eps_and_lr_preconditioner_chose(tmp_path):
  d = tmp_path / "preconditioner" / "cpu"
  for v, eps, best in (("adam", 1e-8, 3e-2), ("micro_adam_msq", 1e-5, 1e-2),
                       ("micro_adam_msq", 1e-4, 1e-2), ("micro_adam", 1e-8, 3e-2),
                       ("micro_adam_var", 1e-8, 1e-1)):
    for lr in (best / 3, best, best * 3):
      for s in (0, 1):
        loss = (4.0 if lr == best else 4.2) + (0.05 if eps == 1e-5 else 0.0)
        _fake_run(d, {"optimizer.variant": v, "optimizer.clip_norm": None,
                      "optimizer.eps": eps, "optimizer.lr": lr, "train.seed": s}, loss)
  _fake_run(d, {"optimizer.variant": "adam", "optimizer.clip_norm": None, "optimizer.eps": 1e-8,
                "optimizer.lr": 0.1, "train.seed": 0}, 17368.0)  # above ln V: diverged
  inputs = Inputs(tmp_path, "cpu")
  assert lr_search.tuned_lr(inputs, "preconditioner",
                            {"optimizer.variant": "adam", "optimizer.clip_norm": None}) == 3e-2
  sw = msq_eps.sweep("cpu", inputs)
  pts = [p for b in sw.blocks for p in b.points()]
  fixed = {(p["optimizer.variant"], p["optimizer.eps"], p["optimizer.lr"]) for p in pts
           if p["train.seed"] in msq_eps.SEEDS}
  assert fixed == {("micro_adam_msq", 1e-4, 1e-2), ("adam", 1e-8, 3e-2)}
  matched = [p for p in pts if p["optimizer.variant"] == "adam" and p["optimizer.eps"] == 1e-4]
  assert sorted({p["optimizer.lr"] for p in matched}) == preconditioner.grid(3e-2, 1)
  assert {p["train.seed"] for p in matched} == set(msq_eps.SELECT)
  assert growth.select_seeds(sw) == msq_eps.SELECT == (0, 1) and sw.base["stats.log_every"] == 50
  # 2 fixed arms x 5 seeds + 2 controls x 3 lrs x 2 selection seeds (+ their 5 fresh later)
  ni = {"optimizer.variant": "adam", "optimizer.eps": 1e-8, "optimizer.lr": 3e-2}  # Adam's arm
  assert len(pts) == 2 * 5 + 2 * 3 * 2 and [p[1:] for p in sw.lr_search.more.pairs(
      pd.DataFrame(columns=msq_eps.GROUP))] == [(ni, "noninferiority")]


def test_no_tuned_value_is_chosen_on_fewer_than_all_selection_seeds():
  """The preconditioner (and msq_eps, which inherits its seeds) selects on ≥ 2 seeds; `best_lr`
  scores an lr on the mean over every selection seed, and an lr one of them has not run is not
  a candidate (seed 0 alone would pick 1e-3; seed 1 has no run there): so ε too is chosen on
  the mean over all of them (`preconditioner.chosen` reads select_loss)."""
  assert len(preconditioner.SELECT) >= 2 and msq_eps.SELECT == preconditioner.SELECT
  assert not set(preconditioner.SELECT) & set(preconditioner.SEEDS)
  g = {"optimizer.variant": "micro_adam_msq", "optimizer.clip_norm": None}
  rows = [{**g, "optimizer.eps": eps, "optimizer.lr": lr, "train.seed": s,
           "final_eval_loss": v, "status": "completed"}
          for eps, lr, s, v in ((1e-4, 1e-3, 0, 3.90), (1e-4, 3e-3, 0, 4.00), (1e-4, 3e-3, 1, 4.02),
                                (1e-4, 1e-2, 0, 4.10), (1e-4, 1e-2, 1, 4.10),
                                (1e-5, 3e-3, 0, 4.05), (1e-5, 3e-3, 1, 3.96),
                                (1e-5, 1e-3, 0, 4.2), (1e-5, 1e-3, 1, 4.2),
                                (1e-5, 1e-2, 0, 4.2), (1e-5, 1e-2, 1, 4.2))]
  best = best_lr(pd.DataFrame(rows), preconditioner.GROUP, "optimizer.lr",
                 select_seed=preconditioner.SELECT)
  by = best.set_index("optimizer.eps")
  assert by.loc[1e-4, "optimizer.lr"] == 3e-3 and by.loc[1e-4, "grid"] == "0.003 0.01"
  assert by.loc[1e-4, "select_loss"] == pytest.approx(4.01)
  assert set(best["select_seed"]) == {"0 1"}
  # seed 0 alone would choose ε 1e-4 (4.00 < 4.05); the mean of both chooses 1e-5 (4.005)
  assert float(preconditioner.chosen(best)["optimizer.eps"].iloc[0]) == 1e-5


def test_a_group_that_no_lr_of_every_selection_seed_finished_chooses_nothing(tmp_path):
  """The selection seeds come from the plan the runs came from; a variant whose seed 1 never
  finished chooses no lr (never one on seed 0 alone), and the report reads it as
  "undetermined: selected", naming the group, instead of comparing the arms left."""
  sel, fresh = preconditioner.SELECT, preconditioner.SEEDS
  runs = {_point(v, 1e-8, lr, s): [7.5, 5.0, base + abs(math.log10(lr / 3e-3))]
          for v, base in (("adam", 4.1), ("micro_adam_var", 4.5)) for lr in (1e-3, 3e-3, 1e-2)
          for s in sel}
  runs |= {_point(v, 1e-8, 3e-3, s): [7.5, 5.0, base + 0.001 * s]
           for v, base in (("adam", 4.1), ("micro_adam_var", 4.5)) for s in fresh}
  runs |= {_point("micro_adam", 1e-8, lr, 0): [7.5, 5.0, 4.3] for lr in (1e-3, 3e-3, 1e-2)}
  fin = marked_finals(table := _table(runs), CPU)
  best = best_lr(fin, preconditioner.GROUP, "optimizer.lr", select_seed=sel)
  assert list(best["optimizer.variant"]) == ["adam", "micro_adam_var"]
  assert best.attrs["unscored"] == ["variant=micro_adam, clip_norm=null, eps=1e-08: no lr ran "
                                    "on every selection seed (0 1; finished: 0)"]
  alone = best_lr(fin[fin["optimizer.variant"] == "micro_adam"], preconditioner.GROUP,
                  "optimizer.lr", select_seed=sel)
  assert alone.empty and {"select_loss", "fresh_seeds", W} <= set(alone.columns)
  out = tmp_path / "pc"
  for r in fin["run"]:
    (out / r / ".hydra").mkdir(parents=True)
    (out / r / ".hydra" / "config.yaml").write_text("schedule:\n  warmup_steps: 20\n")
  preconditioner.analyze(Runs(out, table, fin, preconditioner.sweep("cpu")), out)
  assert set(read_csv(out / "best.csv")["select_seed"]) == {"0 1"}
  guard = lr_search.selected(lr_search.load_best(out))
  assert not guard.ok and guard.why == best.attrs["unscored"][0]
  rep = preconditioner.report(as_planned(out))  # adam beats micro_adam_var by 0.4: decided
  assert "adam beats micro_adam_var" in rep.finding and rep.rule_verdict == "reproduced"
  assert rep.verdict == "undetermined: selected"  # ...but micro_adam was never compared
