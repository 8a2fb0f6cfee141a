"""Markdown of the results: each experiment's README, the claims table, the results index."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pandas as pd

from experiments.calibrate import Calibration
from experiments.record import Experiment, Inputs, Report, experiments
from experiments.sweep import POLICY, REPO, fmt, scale_file

RESOLVED = {"model": ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "seq_len"),
            "data": ("name", "tokenizer", "vocab_size", "seq_len", "batch_size", "eval_batch_size"),
            "train": ("steps", "eval_every", "eval_batches", "checkpoint_every")}


def _resolved_md(name: str, preset: str) -> list[str]:
  """The optimizer, schedule and scale of `experiment=name scale=preset` as Hydra composes
  them (before a sweep's per-run overrides)."""
  from pergrad.analysis import composed

  try:
    c = composed([f"experiment={name}", f"scale={preset}"])
  except Exception as e:  # noqa: BLE001 - the README still gets written
    return [f"Resolved config: could not compose `experiment={name} scale={preset}` ({e}).", ""]
  parts = {"optimizer": c["optimizer"], "schedule": c["schedule"],
           **{p: {k: c[p][k] for k in keys if k in c[p]} for p, keys in RESOLVED.items()}}
  return [f"Resolved (`experiment={name} scale={preset}`, before each run's swept values):", "",
          *(f"- {p}: " + ", ".join(f"`{k}={fmt(v)}`" for k, v in vals.items())
            for p, vals in parts.items()), ""]


def describe_setup(exp: Experiment, preset: str, inputs: Inputs | None = None) -> str:
  """An experiment's settings at `preset` as Markdown: its config files, the resolved
  optimizer, schedule and scale, the grids, the lr search."""
  if exp.sweep is None:
    return exp.describe_setup(preset) if exp.describe_setup else ""
  sw = exp.sweep_at(preset, inputs)
  lines = [f"Configs `configs/experiment/{exp.name}.yaml` and "
           f"`{scale_file(preset).relative_to(REPO)}`.", "", *_resolved_md(exp.name, preset)]
  kv = lambda d: ", ".join(f"`{k}={fmt(v)}`" for k, v in d.items() if k != "experiment")
  lines += [f"Every run (preset `{preset}`): {kv(sw.base)}.", ""]
  for i, bl in enumerate(sw.blocks):
    lines.append(f"- grid {i + 1}: " + "; ".join(f"`{k}` ∈ {{{', '.join(fmt(v) for v in vals)}}}"
                                                  for k, vals in bl.grid.items())
                 + (f" with {kv(bl.fixed)}" if bl.fixed else ""))
  ls = sw.lr_search
  if ls:
    lines += ["", f"Learning-rate search per ({', '.join(f'`{k}`' for k in ls.group_keys)}), "
              f"factor {ls.factor:g}, up to {ls.max_extend} extensions past an edge, fresh seeds "
              f"{list(ls.seeds)}: {POLICY}."]
  if sw.wall_estimate_min is not None:
    lines += ["", f"Estimated wall time: {sw.wall_estimate_min:g} min on 2 cores."]
  return "\n".join(lines)


def write_readme(exp: Experiment, out_dir: Path, report: Report, info: dict,
                 inputs: Inputs | None = None) -> None:
  """README.md and report.json (with `info`'s commit and clean) of one experiment's results."""
  figs = sorted(p.name for p in out_dir.glob("*.png"))
  csvs = sorted(p.name for p in out_dir.glob("*.csv"))
  lines = [
      f"# {exp.name}: {exp.title}",
      "",
      f"**Claim tested.** {exp.claim}",
      "",
      f"**Verdict: {report.verdict}.** {report.finding}",
      "",
      *([f"**Rule.** {report.rule}", ""] if report.rule else []),
      *([f"**Paper.** {report.paper}", ""] if report.paper else []),
      *([f"**Error rates of the rule.** {Calibration(**report.calibration).text()}", ""]
        if report.calibration else []),
      "## Numbers",
      "",
      report.numbers_md,
      "",
      "## Setup",
      "",
      report.setup_md or describe_setup(exp, info["preset"], inputs),
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
      f"`{info['sweep_dir']}` (not committed), commit `{info['commit']}`"
      + ("" if info["clean"] else " with uncommitted changes") + ". This invocation: "
      f"{info['wall_s']:.0f} s, of which {info['launch_wall_s'] / 60:.1f} min launching "
      f"{info['launched']} run(s); {info['skipped']} run(s) were already finished and skipped "
      f"({info['n_runs_completed']} completed runs in the sweep, their own summed wall time "
      f"{info['runs_compute_s'] / 60:.1f} min). Files: " + ", ".join(f"`{c}`" for c in csvs)
      + ". Figures are redrawn from the CSVs alone by `notebooks/figures.ipynb`.",
      "",
  ]
  (out_dir / "README.md").write_text("\n".join(lines))
  prov = {k: info[k] for k in ("commit", "clean")}
  (out_dir / "report.json").write_text(json.dumps(report.to_json(prov), indent=1))


def claim_rows() -> dict[str, tuple]:
  """{row of the claims table: the experiments in it}, both in registration order."""
  rows: dict[str, tuple] = {}
  for name, exp in experiments().items():
    rows[exp.row] = (*rows.get(exp.row, ()), name)
  return rows


def launch_costs(results_root: Path) -> dict[str, float]:
  """{experiment: seconds of launches that made its committed results}: the end-to-end
  record's (reproduction.json, summed over its invocations) for an experiment whose
  run_info.json is from that record's commit, else run_info.json's `launch_wall_s` (the
  invocation that wrote it)."""
  results_root = Path(results_root)
  path = results_root / REPRODUCTION
  record = json.loads(path.read_text()) if path.exists() else {}
  out = {}
  for n in experiments():
    f = results_root / n / "run_info.json"
    if not f.exists():
      continue
    info = json.loads(f.read_text())
    entry = record.get("experiments", {}).get(n)
    if entry and info.get("commit") == record.get("commit"):
      out[n] = float(entry["launch_wall_s"])
    else:
      out[n] = float(info["launch_wall_s"])
  return out


README_BEGIN, README_END = "<!-- claims:begin -->", "<!-- claims:end -->"
STALE = " (written before reports recorded their commit: re-run with the current rules)"
NO_RULE = " (no stated rule: re-run)"
OLD_RULE = " (decided by an earlier rule than the code's: re-run)"


def stale_mark(doc: dict, name: str | None = None) -> str:
  """What the claims table says beside a verdict whose report.json cannot vouch for it:
  no commit (results older than the provenance record), no stated rule, or a rule other
  than the one the experiment's module (`RULE`) states now."""
  if not doc.get("commit"):
    return STALE
  if not doc.get("rule"):
    return NO_RULE
  current = _current_rule(name) if name else None
  return OLD_RULE if current is not None and current != doc["rule"] else ""


def _current_rule(name: str) -> str | None:
  """The RULE of the module that reports experiment `name` (None: it states none)."""
  exp = experiments().get(name)
  return getattr(sys.modules.get(exp.report.__module__), "RULE", None) if exp else None


def claims_table(results_root: Path, link_prefix: str = "") -> str:
  """One short row per experiment: claim, the paper's figure, ours, verdict, the rule's
  false-alarm rate and power (from report.json), and the figures."""
  results_root = Path(results_root)
  f = lambda c, k: "—" if not c or c.get(k) is None or not math.isfinite(float(c[k])) \
      else f"{float(c[k]):.2f}"
  rows = ["| Claim | Experiment | Paper | Ours | Verdict | False alarm | Power | Figures |",
          "|---|---|---|---|---|---|---|---|"]
  for claim, names in claim_rows().items():
    for n in names:
      rep = results_root / n / "report.json"
      if not rep.exists():
        rows.append(f"| {claim} | `{n}` | | not yet run | not yet run | — | — | — |")
        continue
      doc = json.loads(rep.read_text())
      d = Report.from_json(doc)
      figs = " ".join(f"[{p.name}]({link_prefix}{n}/{p.name})"
                      for p in sorted((results_root / n).glob("*.png"))) or "—"
      rows.append(f"| {claim} | [`{n}`]({link_prefix}{n}/README.md) | {d.paper or '—'} | {d.ours} "
                  f"| **{d.verdict}**{stale_mark(doc, n)} | {f(d.calibration, 'false_alarm')} | "
                  f"{f(d.calibration, 'power')} | {figs} |")
  return "\n".join(rows)


def _seeds(d: Path) -> str | None:
  """Seeds behind an experiment's reported numbers, from its CSVs ("2", "1-2")."""
  for csv, col in (("best.csv", "n_seeds"), ("collapse.csv", "n_seeds")):
    if (d / csv).exists():
      df = pd.read_csv(d / csv)
      if col in df and df[col].notna().any():
        lo, hi = int(df[col].min()), int(df[col].max())
        return str(lo) if lo == hi else f"{lo}-{hi}"
  if (d / "finals.csv").exists():
    df = pd.read_csv(d / "finals.csv")
    if "train.seed" in df:
      return str(df["train.seed"].nunique())
  return None


def setup_text(results_root: Path, preset: str = "cpu") -> str:
  """The setup behind the claims table, from the configs (the `preset` scale composed with
  the defaults) and the committed CSVs (seeds) and run_info.json (wall times)."""
  from pergrad.analysis import n_params, scale_summary

  results_root = Path(results_root)
  m = scale_summary([f"scale={preset}"])
  seeds = [(n, _seeds(results_root / n)) for n in experiments()]
  seeds_text = ", ".join(f"{n} {s}" for n, s in seeds if s)
  wall = sum(launch_costs(results_root).values())
  return (
      f"Setup (preset `{preset}`, `configs/scale/{preset}.yaml` over the defaults): the "
      f"`{m['model']}` transformer ({m['n_layers']} layers, width {m['d_model']}, "
      f"{m['n_heads']} heads, {n_params([f'scale={preset}']):,} parameters) on `{m['data']}` "
      f"with a {m['vocab_size']}-token {m['tokenizer']} vocabulary, B = {m['batch_size']} "
      f"sequences of T = {m['seq_len']} tokens, {m['steps']} steps (`batch_scaling` sets its "
      "own steps "
      f"per batch size), each experiment's own grids and learning rates (its README). Seeds "
      f"behind the reported numbers: {seeds_text or 'none yet'}. The committed results took "
      f"{wall / 60:.0f} min of launches on 2 cores (per experiment: the cost table of "
      f"`results/{preset}/README.md`); "
      f"`python scripts/reproduce.py all --preset {preset}` regenerates them (resumable). "
      "The paper trained far larger models on TPUs: these are statements about this scale "
      "only.")


def claims_block(results_root: Path, link_prefix: str = "", preset: str = "cpu") -> str:
  """The setup paragraph and the claims table: the README's generated block."""
  return setup_text(results_root, preset) + "\n\n" + claims_table(results_root, link_prefix)


README_PRESET = "cpu"  # the preset whose results the top-level README's claims show


def render_readme(readme: Path = REPO / "README.md",
                  results_root: Path = REPO / "results" / README_PRESET,
                  link_prefix: str = f"results/{README_PRESET}/") -> bool:
  """Rewrites the block of `readme` between README_BEGIN and README_END with
  `claims_block`; returns whether the file changed. ValueError without both markers."""
  text = Path(readme).read_text()
  if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
    raise ValueError(f"{readme} needs one {README_BEGIN} and one {README_END} line.")
  head, rest = text.split(README_BEGIN)
  _, tail = rest.split(README_END)
  new = (head + README_BEGIN + "\n" + claims_block(results_root, link_prefix) + "\n"
         + README_END + tail)
  if new != text:
    Path(readme).write_text(new)
  return new != text


def readme_block(readme: Path = REPO / "README.md") -> str:
  """What `readme` holds between its markers (without them and the newlines around)."""
  text = Path(readme).read_text()
  return text.split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip("\n")


def index_text(results_root: Path, preset: str) -> str:
  """results/<preset>/README.md: the claims (`claims_block`) and each experiment's cost."""
  times, costs = [], launch_costs(results_root)
  for n in experiments():
    p = results_root / n / "run_info.json"
    if p.exists():
      d = json.loads(p.read_text())
      times.append(f"| `{n}` | `{d['command']}` | {costs[n] / 60:.1f} | "
                   f"{d['n_runs_completed']} |")
    else:
      times.append(f"| `{n}` | `python scripts/reproduce.py {n} --preset {preset}` | "
                   "not yet run | — |")
  return "\n".join([
      "# Results",
      "",
      "The findings of Roulet & Agarwala (arXiv 2510.00236) and Gray et al. (arXiv "
      "2411.00999) at the scale of a 2-core CPU machine, from runs actually made "
      f"(`scripts/reproduce.py EXPERIMENT --preset {preset}`): whether each *qualitative* "
      "finding holds at this small scale. Each experiment's README gives the rule, numbers, "
      "setup, figures and command.",
      "",
      claims_block(results_root, preset=preset),
      "",
      *reproduction_lines(results_root),
      f"## Cost of each experiment ({preset} preset, this machine)",
      "",
      "| Experiment | Command | Wall time (min) | Runs |",
      "|---|---|---|---|",
      *times,
      "",
      "Wall times of the launches that made the committed results (often beside other jobs). "
      f"Regenerate: `python scripts/reproduce.py all --preset {preset}` (resumable); redraw "
      "the figures from the CSVs: `notebooks/figures.ipynb`.",
      "",
  ])


REPRODUCTION = "reproduction.json"  # written by `scripts/reproduce.py all`


def reproduction_lines(results_root: Path) -> list[str]:
  """The end-to-end record of results/reproduction.json, or nothing."""
  path = Path(results_root) / REPRODUCTION
  if not path.exists():
    return []
  d = json.loads(path.read_text())
  rows = [f"| `{n}` | {e['wall_s'] / 60:.1f} | {e['status']} |"
          for n, e in d["experiments"].items()]
  inv = d.get("invocations", [])
  resumed = (f" in {len(inv)} invocations of that command (each resumed the stopped one, "
             "skipping its finished runs; wall times "
             + " + ".join(f"{i['wall_s'] / 60:.0f}" for i in inv) + " min)"
             if len(inv) > 1 else "")
  end = (f"finished {d['finished']}" if d.get("finished")
         else "NOT finished (stopped" + (f" during `{d['running']['name']}`"
                                         if d.get("running") else "") + ")")
  return [
      "## The end-to-end reproduction",
      "",
      f"`{d['command']}`, from an empty sweeps directory"
      + ("" if d.get("fresh") else " (NOT empty: some runs were skipped as finished)")
      + f", at commit `{d['commit']}`"
      + (" with uncommitted changes" if d.get("clean") is False else "")
      + f"{resumed}: started {d['started']}, {end}, "
      f"**{d['wall_s'] / 60:.0f} min** of wall time on this 2-core machine.",
      "",
      "| Experiment | Wall time (min) | Status |",
      "|---|---|---|",
      *rows,
      "",
  ]


def write_index(results_root: Path, preset: str) -> Path:
  """Writes results/<preset>/README.md (`index_text`), from that preset's results only."""
  path = Path(results_root) / "README.md"
  path.write_text(index_text(results_root, preset))
  return path
