"""Claim 3, follow-up: is MicroAdamMSQ's result its μ² preconditioner or its ε floor?

Our reading of MicroAdamMSQ, v = EMA_β2(max(ḡ² − σ̂²/B, 0)), puts v = 0 on every
coordinate whose batch mean is noise-dominated (ḡ² ≤ σ̂²/B), where its update
m̂/(√v̂ + ε) is m̂/ε: there it is momentum scaled by 1/ε. Whether it "works" because of μ²
or because ε dominates its denominator is separated two ways:

- eps_share (`pergrad.optim.diagnostics`): on MicroAdamMSQ's (and Adam's) own runs, the
  share of coordinates where ε > √v̂, logged every `LOG_EVERY` steps, per leaf and over
  all coordinates;
- an ε-only control: the Adam family at ε = `CONTROL_EPS` = 1, far above every √v̂
  (eps_share ≈ 1 on its runs), whose update is m̂ (heavy-ball momentum up to a constant
  factor that its own lr search absorbs): the direction Adam has when ε ≫ √v.

MicroAdamMSQ and Adam run at the ε and lr that the preconditioner experiment chose for
them (`preconditioner.chosen`: its selection seeds 0 and 1), on the fresh seeds (2, 3, 4);
the control's lr is searched here by the same policy (`experiments.lr_search`). A run
whose eval loss exceeds ln V diverged. The verdict is `RULE`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from experiments import lr_search, preconditioner
from experiments.record import ROWS, Experiment, Report, register
from experiments.report_md import md_table
from experiments.runs import stat_columns
from experiments.sweep import Block, LrSearch, Sweep, base_for, fmt
from experiments.verdict import LOSS, TIE, UNDETERMINED, WIN, compare, pairs_md, summarize

NAME = "msq_eps"
TITLE = "MicroAdamMSQ: its μ² preconditioner or its ε floor?"
CLAIM = ("A preconditioner dominated by μ² works at least as well as Adam's μ² + σ²/B "
         "(tested on MicroAdamMSQ, whose v is 0 where the mean is noise-dominated, so ε "
         "sets the floor of √v there).")
GROUP = ("optimizer.variant", "optimizer.eps")
MSQ, ADAM = "micro_adam_msq", "adam"
CONTROL_EPS = 1.0  # ε ≫ √v̂: the update is m̂ (momentum)
SELECT = preconditioner.SELECT  # the control's selection seeds
SEEDS = preconditioner.SEEDS  # the reported seeds of all three
LOG_EVERY = {"ci": 10, "cpu": 50, "paper": 500}  # stats.log_every: eps_share on these steps
EPS_DOMINATED = 0.5  # eps_share above this: ε dominates the denominator on most coordinates
RULE = (lr_search.DIVERGED_RULE + " MicroAdamMSQ and Adam run at the ε and lr the "
        "preconditioner experiment chose (its selection seeds), the ε-only control (ε = 1, "
        "update ≈ m̂: momentum) at the lr with the lowest mean over the selection seeds "
        "(0, 1); all three are compared on the fresh seeds (2, 3, 4), A beating B when "
        "its gap of seed means exceeds √(s_A² + s_B²) (diverged runs lose, < 2 seeds: "
        "undetermined). Not reproduced if MicroAdamMSQ loses to Adam; undetermined if that "
        "pair is; reproduced if it wins or ties against Adam AND beats the control (its "
        "result is more than its ε floor); partly reproduced if it wins or ties against "
        "Adam but does not beat the control (it behaves like momentum: ε, not μ², can "
        f"explain it). eps_share > {EPS_DOMINATED:g} (the mean over its logged steps and "
        "seeds) reads as 'ε dominates its denominator'.")


def sweep(preset: str, inputs=None) -> Sweep:
  base = base_for(NAME, preset, **{"stats.log_every": LOG_EVERY[preset]})
  control = {"optimizer.variant": [ADAM], "optimizer.eps": [CONTROL_EPS]}
  if preset == "ci":  # the control first: its seed is the selection seed
    blocks = (Block({**control, "optimizer.lr": [1.0], "train.seed": [0]}),
              Block({"optimizer.variant": [MSQ], "optimizer.eps": [1e-4],
                     "optimizer.lr": [3e-3], "train.seed": list(SEEDS[:2])}))
    return Sweep(base, blocks, LrSearch(GROUP, max_extend=0), wall_estimate_min=0.5)
  best = preconditioner.chosen(lr_search.tuned_best(inputs, "preconditioner"))
  best = best[best["optimizer.clip_norm"].isna()]
  fixed = []
  for v in (MSQ, ADAM):
    row = best[best["optimizer.variant"] == v]
    if len(row) != 1:
      raise ValueError(f"preconditioner's search has {len(row)} unclipped {v} groups; "
                       "re-run `python scripts/reproduce.py preconditioner`")
    r = row.iloc[0]
    fixed.append(Block({"optimizer.variant": [v], "optimizer.eps": [float(r["optimizer.eps"])],
                        "optimizer.lr": [float(r["optimizer.lr"])],
                        "train.seed": list(SEEDS)}))
  # The control's update is m̂ (~1e-3 per coordinate), so its lr is ~1/√v̂ times Adam's.
  lrs = [0.3, 1.0, 3.0] if preset == "cpu" else [0.03, 0.1, 0.3, 1.0]
  blocks = (Block({**control, "optimizer.lr": lrs, "train.seed": list(SELECT)}), *fixed)
  return Sweep(base, blocks, LrSearch(GROUP, max_extend=2, seeds=SEEDS),
               wall_estimate_min=16 if preset == "cpu" else None)


def _label(g: dict) -> str:
  if g["optimizer.variant"] == ADAM and float(g["optimizer.eps"]) == CONTROL_EPS:
    return "control (adam, eps=1: momentum)"
  return f"{g['optimizer.variant']}, eps={fmt(float(g['optimizer.eps']))}"


def eps_share(table: pd.DataFrame) -> pd.DataFrame:
  """One row per run: its group, seed, and the mean over its logged steps of
  opt/all/eps_share and of each leaf's (`eps_share` and `eps_share/<leaf>` columns)."""
  cols = stat_columns(table, "eps_share", "opt")
  keys = [k for k in (*GROUP, "optimizer.lr", "train.seed") if k in table]
  if not cols:
    return pd.DataFrame(columns=[*keys, "eps_share"])
  rows = []
  for _, g in table.groupby("run", sort=False):
    row = {k: g[k].iloc[0] for k in keys}
    for c in cols:
      name = "eps_share" if c == "opt/all/eps_share" else "eps_share/" + c.split("/", 1)[1]
      row[name.removesuffix("/eps_share")] = float(g[c].dropna().mean())
    rows.append(row)
  return pd.DataFrame(rows)


def analyze(table: pd.DataFrame, fin: pd.DataFrame, out_dir: Path) -> None:
  """lr_search's CSVs (the control's search; finals.csv holds every run) and
  eps_share.csv."""
  lr_search.analyze(table, fin, out_dir, GROUP, select_seed=SELECT)
  eps_share(table).to_csv(Path(out_dir) / "eps_share.csv", index=False)


def figures(out_dir: Path) -> list[Path]:
  return lr_search.figures(out_dir, GROUP, "MicroAdamMSQ, Adam and the ε-only control",
                           labeler=_label)


def _fresh(fin: pd.DataFrame, variant: str, control: bool) -> tuple[str, list[float]]:
  """(label, final eval losses) of the fixed group of `variant` (run on fresh seeds only)."""
  rows = fin[(fin["optimizer.variant"] == variant)
             & (np.isclose(fin["optimizer.eps"].astype(float), CONTROL_EPS) == control)]
  if rows.empty:
    return variant, []
  return _label(rows.iloc[0].to_dict()), [float(x) for x in rows["final_eval_loss"]]


def verdict_of(head, ctrl) -> str:
  """`RULE` on MicroAdamMSQ vs Adam (`head`) and MicroAdamMSQ vs the control (`ctrl`)."""
  if head.outcome == LOSS:
    return "not reproduced"
  if head.outcome == UNDETERMINED:
    return "undetermined"
  return "reproduced" if ctrl.outcome == WIN else "partly reproduced"


def report(out_dir: Path) -> Report:
  out_dir = Path(out_dir)
  fin = pd.read_csv(out_dir / "finals.csv")
  best = lr_search.load_best(out_dir)
  shares = pd.read_csv(out_dir / "eps_share.csv") if (out_dir / "eps_share.csv").exists() \
      else pd.DataFrame()
  msq, adam = _fresh(fin, MSQ, False), _fresh(fin, ADAM, False)
  ctrl_rows = best[np.isclose(best["optimizer.eps"].astype(float), CONTROL_EPS)]
  ctrl = (_label(ctrl_rows.iloc[0].to_dict()), list(ctrl_rows.iloc[0]["values"])) \
      if len(ctrl_rows) else ("control", [])
  head = compare(msq[1], adam[1], (msq[0], adam[0]))
  vs_ctrl = compare(msq[1], ctrl[1], (msq[0], ctrl[0]))
  pairs = [head, vs_ctrl, compare(adam[1], ctrl[1], (adam[0], ctrl[0]))]
  if not msq[1] or not adam[1]:
    verdict = "not tested (no MicroAdamMSQ or no Adam run in this preset)"
  else:
    verdict = verdict_of(head, vs_ctrl)
  share = {}
  if not shares.empty and "eps_share" in shares:
    for key, g in shares.groupby(list(GROUP), sort=False):
      share[_label(dict(zip(GROUP, key, strict=True)))] = float(g["eps_share"].mean())
  share_txt = "; ".join(f"{k}: {v:.1%}" for k, v in share.items())
  s_msq = share.get(msq[0], np.nan)
  like = ("MicroAdamMSQ behaves like the ε-only control (momentum): it does not beat it, so "
          "its result can be explained by ε, not μ²."
          if vs_ctrl.outcome in (TIE, LOSS) else "")
  dom = (f"ε dominates MicroAdamMSQ's denominator on {s_msq:.0%} of its coordinates."
         if s_msq > EPS_DOMINATED else
         f"ε dominates MicroAdamMSQ's denominator on only {s_msq:.0%} of its coordinates."
         if np.isfinite(s_msq) else "")
  finding = " ".join(x for x in [
      f"Rule: {RULE}",
      "Fresh-seed final eval loss: " + "; ".join(
          f"{name}: {summarize(v).text()}" for name, v in (msq, adam, ctrl)) + ".",
      *(p.sentence() + "." for p in pairs), like, dom,
      f"Share of coordinates where ε > √v̂ (mean over logged steps and seeds): {share_txt}."
      if share_txt else "",
      lr_search.search_notes(best, _label)] if x)
  numbers = (lr_search.best_md(best, GROUP) + "\n\nMicroAdamMSQ vs Adam (the verdict), vs "
             "the ε-only control, and Adam vs the control:\n\n" + pairs_md(pairs))
  if not shares.empty:
    cols = [c for c in (*GROUP, "train.seed", "eps_share") if c in shares]
    numbers += ("\n\neps_share per run (mean over its logged steps; per leaf: "
                "eps_share.csv):\n\n" + md_table(shares[cols]))
  return Report(verdict=verdict, rule=RULE, finding=finding,
                claim_row="; ".join(f"{p.a} vs {p.b}: {p.outcome}" for p in pairs)
                + (f" (eps_share: {share_txt})" if share_txt else ""),
                numbers_md=numbers)


EXPERIMENT = register(Experiment(
    name=NAME, title=TITLE, claim=CLAIM, row=ROWS["3"], sweep=sweep, analyze=analyze,
    figures=figures, report=report, needs=("preconditioner",)))
