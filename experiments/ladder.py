"""The scale ladder (issue 40): the claims whose verdict may depend on scale, each at three
model sizes (the largest today's `tiny`) at the same tokens per parameter, one figure per claim
with the trend and the paper's value marked, so that a "not reproduced" at tiny scale says
which way it moves.

  claim  experiment    quantity (from its committed CSVs)                     paper
  C3c    moments       r = Σμ̂²/Σ(σ̂²/B), second half, the scale's B, no norm  > 1
  C4     lr_exponent   α of lr*(B) ∝ B^α                                      0.5
  G2     gns_layers    r(complement, norm) at the tracker's α                 high (0.95, ours)
  G3     gns_ramp      token saving of the ramp to fixed B_max's final loss   0.18

A rung is a model (`RUNGS`: overrides of model.*) and the number of the preset's steps that
gives it `TOKENS_PER_PARAM` (`plan`). Launching a rung needs the experiments to take their
budget from it: those that derive their steps from the scale (batch sizes × steps) read
`configs/scale/<preset>.yaml`, so each rung becomes a scale preset of its own (`cpu_xs`, ...,
written from `plan`) once `experiments.sweep.PRESETS` lists them; until then `plan` and the
figures are what this module provides, and the clean run launches the `tiny` rung only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from pergrad.analysis.plots import plt, savefig, style
from pergrad.analysis.runs import read_csv

RUNGS = {  # model overrides over the scale's model; the last is the scale's own (`tiny`)
    "xs": {"model.n_layers": 2, "model.d_model": 16, "model.n_heads": 2, "model.d_ff": 64},
    "s": {"model.n_layers": 2, "model.d_model": 48, "model.n_heads": 4, "model.d_ff": 192},
    "tiny": {},
}
TOKENS_PER_PARAM = 20.0  # Chinchilla-proportioned at every rung (G3's regime)
PAPER = {"moments": 1.0, "lr_exponent": 0.5, "gns_layers": 0.95, "gns_ramp": 0.18}
LABEL = {"moments": "C3c: r = Σμ̂²/Σ(σ̂²/B) (> 1: μ² dominates)",
         "lr_exponent": "C4: α of lr* ∝ B^α (√ scaling: 0.5)",
         "gns_layers": "G2: r(complement, norm layers)",
         "gns_ramp": "G3: token saving of the ramp (paper: 18 %)"}


def plan(preset: str = "cpu") -> pd.DataFrame:
  """Per rung: its parameters, the steps at the preset's batch size and sequence length that
  give it TOKENS_PER_PARAM, those tokens, and the cost relative to the preset's own run."""
  from pergrad.analysis import n_params, scale_summary

  s = scale_summary([f"scale={preset}"])
  per_step = s["batch_size"] * s["seq_len"]
  rows = []
  for rung, over in RUNGS.items():
    n = n_params([f"scale={preset}", *(f"{k}={v}" for k, v in over.items())])
    steps = math.ceil(TOKENS_PER_PARAM * n / per_step)
    rows.append({"rung": rung, "n_params": n, "train.steps": steps, "tokens": steps * per_step,
                 "tokens_per_param": steps * per_step / n,
                 "steps_vs_preset": steps / s["steps"]})
  return pd.DataFrame(rows)


def quantity(name: str, out_dir: Path) -> float:
  """The claim's number from an experiment's result CSVs (NaN when absent)."""
  d = Path(out_dir)
  if name == "moments":
    from experiments import moments

    v = moments.leaf_views(d, "second")
    return float(v["ratio_of_sums_no_norm"].mean()) if v is not None else math.nan
  if name == "lr_exponent":
    from experiments import lr_exponent

    star = read_csv(d / "lr_star.csv")
    return lr_exponent.fit(star)["alpha"] if len(star) else math.nan
  if name == "gns_layers":
    from experiments import gns_layers

    reg = read_csv(d / gns_layers.PART_WHOLE)
    at = reg[np.isclose(reg["alpha"], gns_layers.ALPHA)] if len(reg) else reg
    return float(at["r_complement"].mean()) if len(at) else math.nan
  if name == "gns_ramp":
    from pergrad.analysis.runs import seed_mean_to_target

    tt, cur = read_csv(d / "to_target.csv"), read_csv(d / "curves.csv")
    if tt.empty or cur.empty:
      return math.nan
    saving = seed_mean_to_target(cur, "fixed", float(tt["target"].iloc[0])).set_index("arm")
    return float(saving.loc["ramp", "token_saving"]) if "ramp" in saving.index else math.nan
  raise ValueError(f"ladder: no quantity for {name!r}; give one of {sorted(PAPER)}")


def collect(results: dict[str, Path], sizes: dict[str, int]) -> pd.DataFrame:
  """{rung: its results folder (holding one folder per experiment)}, {rung: n_params} -> one
  row per (claim, rung): the quantity and the paper's value."""
  return pd.DataFrame([{"claim": name, "rung": rung, "n_params": sizes[rung],
                        "value": quantity(name, Path(root) / name), "paper": PAPER[name]}
                       for rung, root in results.items() for name in PAPER])


def figures(points: pd.DataFrame, out_dir: Path) -> list[Path]:
  """ladder_<claim>.png: the quantity against the parameter count (log), the paper's value as a
  dashed line, from `collect`'s table."""
  paths = []
  for name, g in points.groupby("claim", sort=False):
    g = g.sort_values("n_params")
    fig, ax = plt().subplots(figsize=(5, 3.8))
    ax.plot(g["n_params"], g["value"], "o-", label="ours")
    ax.axhline(PAPER[name], color="k", ls="--", lw=0.8, label="paper")
    ax.set_xscale("log")
    style(ax, xlabel="parameters", ylabel=LABEL[name], legend=8, grid=True)
    paths.append(savefig(fig, Path(out_dir) / f"ladder_{name}.png"))
  return paths
