"""Markdown of the results: number formatting, tables, each experiment's README, the index."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from experiments.sweep import REPO, fmt, scale_file


def fmt_num(x: float, digits: int = 3) -> str:
  if x is None or (isinstance(x, float) and math.isnan(x)):
    return "n/a"
  if isinstance(x, float) and math.isinf(x):
    return "diverged"
  return f"{x:.{digits}g}" if abs(x) < 1e-2 or abs(x) >= 1e4 else f"{x:.{digits}f}"


def md_table(df: pd.DataFrame) -> str:
  """A small DataFrame as a Markdown table (no tabulate dependency)."""
  cols = list(df.columns)
  lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
  for _, r in df.iterrows():
    cells = [fmt_num(v) if isinstance(v, float) else str(v) for v in r]
    lines.append("| " + " | ".join(cells) + " |")
  return "\n".join(lines)


def _yaml_block(path: Path, title: str) -> list[str]:
  if not path.exists():
    return []
  body = [ln for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]
  return [f"{title} `{path.relative_to(REPO)}`:", "", "```yaml", *body, "```", ""]


def describe_setup(mod, preset: str) -> str:
  """The settings of an experiment at `preset`, as Markdown, from its own definitions."""
  if not hasattr(mod, "sweep"):
    return mod.describe_setup(preset)
  sw = mod.sweep(preset)
  lines = [*_yaml_block(REPO / "configs" / "experiment" / f"{mod.NAME}.yaml", "Experiment config"),
           *_yaml_block(scale_file(preset), "Scale")]
  lines.append("Every run (preset `" + preset + "`): "
               + ", ".join(f"`{k}={fmt(v)}`" for k, v in sw.base.items()
                           if k != "experiment") + ".")
  lines.append("")
  for i, bl in enumerate(sw.blocks):
    grid = "; ".join(f"`{k}` ∈ {{{', '.join(fmt(v) for v in vals)}}}"
                     for k, vals in bl.grid.items())
    fixed = (" with " + ", ".join(f"`{k}={fmt(v)}`" for k, v in bl.fixed.items())
             if bl.fixed else "")
    lines.append(f"- grid {i + 1}: {grid}{fixed}")
  ls = sw.lr_search
  if ls:
    lines += ["", f"Learning-rate search per ({', '.join(f'`{k}`' for k in ls.group_keys)}): "
              f"a grid whose best value lies at an edge is extended by a factor {ls.factor:g} "
              f"past that edge, up to {ls.max_extend} times"
              + (f"; then `{ls.seed_key}` ∈ {{{', '.join(map(str, ls.seeds))}}} is added at "
                 "each group's best learning rate (chosen on the first seed)." if ls.seeds
                 else ".")]
  return "\n".join(lines)


def write_readme(mod, out_dir: Path, report: dict, info: dict) -> None:
  figs = sorted(p.name for p in out_dir.glob("*.png"))
  csvs = sorted(p.name for p in out_dir.glob("*.csv"))
  wall_min = info["launch_wall_s_total"] / 60
  lines = [
      f"# {mod.NAME}: {mod.TITLE}",
      "",
      f"**Claim tested.** {mod.CLAIM}",
      "",
      f"**Verdict: {report['verdict']}.** {report['finding']}",
      "",
      "## Numbers",
      "",
      report.get("numbers_md", ""),
      "",
      "## Setup",
      "",
      report.get("setup_md") or describe_setup(mod, info["preset"]),
      "",
      "## Figures",
      "",
      *[f"![{f}]({f})" for f in figs],
      "",
      "## Regenerate",
      "",
      "```",
      info["command"],
      "```",
      "",
      f"Preset `{info['preset']}`, launcher `{info['launcher']}`. Sweep directory "
      f"`{info['sweep_dir']}` (not committed). Measured wall time of the launches: "
      f"{wall_min:.1f} min in total ({info['n_runs_completed']} completed runs; the runs' own "
      f"summed wall time {info['runs_compute_s'] / 60:.1f} min); last invocation "
      f"{info['last_invocation_wall_s']:.0f} s, of which {info['last_invocation_skipped']} "
      "run(s) were already finished and skipped. Files: " + ", ".join(f"`{c}`" for c in csvs)
      + ". Figures are redrawn from the CSVs alone by `notebooks/figures.ipynb`.",
      "",
  ]
  (out_dir / "README.md").write_text("\n".join(lines))
  (out_dir / "report.json").write_text(json.dumps(
      {k: v for k, v in report.items() if k in ("verdict", "finding", "claim_row")}, indent=1))


CLAIMS = (
    ("1. Per-example statistics are cheap (surgery ~free for some statistics; vmap viable)",
     ("overhead",)),
    ("2. Sign placement: the later the sign, the better (SignEMA wins), following the SNR",
     ("sign_placement", "snr")),
    ("3. Adam's preconditioner is best when dominated by the mean squared μ², not σ²",
     ("preconditioner", "msq_eps", "moments")),
    ("4. sqrt(B) learning-rate scaling collapses loss-vs-examples curves for small/medium B",
     ("batch_scaling",)),
)


def write_index(results_root: Path, experiments: tuple) -> Path:
  """results/README.md: one row per claim, from the committed results only."""
  rows = ["| Claim | What we measured | Figures | Verdict |", "|---|---|---|---|"]
  for claim, names in CLAIMS:
    measured, figs, verdicts = [], [], []
    for n in names:
      rep = results_root / n / "report.json"
      if not rep.exists():
        measured.append(f"`{n}`: not yet run")
        verdicts.append(f"{n}: not yet run")
        continue
      d = json.loads(rep.read_text())
      measured.append(f"`{n}`: {d.get('claim_row') or d['finding']}")
      verdicts.append(f"{n}: **{d['verdict']}**")
      figs += [f"[{p.name}]({n}/{p.name})" for p in sorted((results_root / n).glob("*.png"))]
    rows.append(f"| {claim} | {'<br>'.join(measured)} | {' '.join(figs) or '—'} | "
                f"{'<br>'.join(verdicts)} |")
  times = []
  for n in experiments:
    p = results_root / n / "run_info.json"
    if p.exists():
      d = json.loads(p.read_text())
      times.append(f"| `{n}` | `{d['command']}` | {d['launch_wall_s_total'] / 60:.1f} | "
                   f"{d['n_runs_completed']} |")
    else:
      times.append(f"| `{n}` | `python scripts/reproduce.py {n} --preset cpu` | not yet run | — |")
  text = "\n".join([
      "# Results",
      "",
      "Reproduction of the findings of Roulet & Agarwala, *Per-example gradients: a new "
      "frontier for understanding and improving optimizers* (arXiv 2510.00236), at the scale "
      "of a 2-core CPU machine (tiny transformers on the embedded Shakespeare corpus), with "
      "`scripts/reproduce.py EXPERIMENT --preset cpu`. Every verdict below comes from runs "
      "actually made; an experiment marked *not yet run* has no verdict. The paper ran "
      "large transformers on TPUs, so a verdict here says whether the *qualitative* finding "
      "holds at this small scale, nothing more. Each experiment's own README gives the "
      "setup, numbers, figures and the exact command.",
      "",
      *rows,
      "",
      "## Cost of each experiment (cpu preset, this machine)",
      "",
      "| Experiment | Command | Wall time (min) | Runs |",
      "|---|---|---|---|",
      *times,
      "",
      "Wall times are those of the launches that made the committed results, often with "
      "other jobs sharing the 2 cores (preconditioner and batch_scaling ran with "
      "`--launcher joblib --n-jobs 2`). Regenerate everything: `python scripts/reproduce.py "
      "all --preset cpu` (resumable: finished runs are skipped; about 2.5 hours). Redraw the "
      "figures from the CSVs: `notebooks/figures.ipynb`.",
      "",
  ])
  path = results_root / "README.md"
  path.write_text(text)
  return path
