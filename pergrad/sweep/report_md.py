"""Markdown of the results from templates: each experiment's README, the claims table, the
results index."""

from __future__ import annotations

import collections
import json
import math
import re
import sys
from pathlib import Path

from pergrad.analysis.calibrate import Calibration
from pergrad.analysis.report import finding
from pergrad.analysis.runs import fmt, read_csv
from pergrad.sweep import POLICY, REPO, scale_file
from pergrad.sweep.claims import LEGEND, claim_rows
from pergrad.sweep.record import Experiment, Inputs, Report, experiments, report_commits

RESOLVED = {"model": ("n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "seq_len"),
            "data": ("name", "tokenizer", "vocab_size", "seq_len", "batch_size", "eval_batch_size"),
            "train": ("steps", "eval_every", "eval_batches", "checkpoint_every")}
kv = lambda d: ", ".join(f"`{k}={fmt(v)}`" for k, v in d.items() if k != "experiment")


def describe_setup(exp: Experiment, preset: str, inputs: Inputs | None = None) -> str:
  """An experiment's settings at `preset` as Markdown: its config files, the optimizer,
  schedule and scale as Hydra composes them (before each run's overrides), the grids, the lr
  search."""
  from pergrad.analysis import composed

  if exp.sweep is None:
    return exp.describe_setup(preset) if exp.describe_setup else ""
  sw, at = exp.sweep_at(preset, inputs), f"experiment={exp.name} scale={preset}"
  try:
    c = composed(at.split())
  except Exception as e:  # noqa: BLE001 - the README still gets written
    resolved = [f"Resolved config: could not compose `{at}` ({e})."]
  else:
    parts = {"optimizer": c["optimizer"], "schedule": c["schedule"],
             **{p: {k: c[p][k] for k in keys if k in c[p]} for p, keys in RESOLVED.items()}}
    resolved = [f"Resolved (`{at}`, before each run's swept values):", "",
                *(f"- {p}: {kv(vals)}" for p, vals in parts.items())]
  lines = [f"Configs `configs/experiment/{exp.name}.yaml` and "
           f"`{scale_file(preset).relative_to(REPO)}`.", "", *resolved, "",
           f"Every run (preset `{preset}`): {kv(sw.base)}.", ""]
  for i, bl in enumerate(sw.blocks):
    lines.append(f"- grid {i + 1}: " + "; ".join(f"`{k}` ∈ {{{', '.join(fmt(v) for v in vals)}}}"
                                                  for k, vals in bl.grid.items())
                 + (f" with {kv(bl.fixed)}" if bl.fixed else ""))
  if ls := sw.lr_search:
    lines += ["", f"Learning-rate search per ({', '.join(f'`{k}`' for k in ls.group_keys)}), "
              f"factor {ls.factor:g}, up to {ls.max_extend} extensions past an edge, fresh seeds "
              f"{list(ls.seeds)}: {POLICY}."]
  if sw.wall_estimate_min is not None:
    lines += ["", f"Estimated wall time: {sw.wall_estimate_min:g} min on 2 cores."]
  return "\n".join(lines)


README = """# {exp.name}: {exp.title}

**Claim tested.** {exp.claim}

**Verdict: {r.headline}.** {body}

{stated}## Numbers

{r.numbers_md}

## Setup

{setup}

## Figures

{figures}
## Regenerate

```
{i[command]}
```

Preset `{i[preset]}`, launcher `{i[launcher]}`. Sweep directory `{i[sweep_dir]}` (not \
committed), commit `{i[commit]}`{dirty}. This invocation: {i[wall_s]:.0f} s, of which \
{launch_min:.1f} min launching {i[launched]} run(s); {i[skipped]} run(s) were already finished \
and skipped ({i[n_runs_completed]} completed runs in the sweep, their own summed wall time \
{compute_min:.1f} min). Files: {files}. Figures are redrawn from the CSVs alone by \
`notebooks/figures.ipynb`.
"""


def write_readme(exp: Experiment, out_dir: Path, report: Report, info: dict,
                 inputs: Inputs | None = None) -> None:
  """README.md (`README`) and report.json (with `info`'s commit and clean) of one
  experiment's results."""
  cal = report.calibration and Calibration(**report.calibration).text()
  stated = "".join(f"**{k}.** {v}\n\n" for k, v in (
      ("Rule", report.rule), ("Paper", report.paper), ("Error rates of the rule", cal),
      ("Validity guards, checked before the verdict", report.guards_text())) if v)
  (out_dir / "README.md").write_text(README.format(
      exp=exp, r=report, body=finding("", report.ours, report.checks), i=info, stated=stated,
      dirty="" if info["clean"] else
      " with uncommitted changes", setup=report.setup_md or info.get("setup_md") or
      describe_setup(exp, info["preset"], inputs), launch_min=info["launch_wall_s"] / 60,
      figures="".join(f"![{p.name}]({p.name})\n" for p in sorted(out_dir.glob("*.png"))),
      compute_min=info["runs_compute_s"] / 60,
      files=", ".join(f"`{p.name}`" for p in sorted(out_dir.glob("*.csv*")))))
  prov = {k: info[k] for k in ("commit", "clean")}
  (out_dir / "report.json").write_text(json.dumps(report.to_json(prov), indent=1))


def _json(path: Path) -> dict | None:
  return json.loads(path.read_text()) if path.exists() else None


def launch_costs(results_root: Path) -> dict[str, float]:
  """{experiment: seconds of launches that made its committed results}: run_info.json's
  `launch_wall_s`, which sums the invocations at its commit and sweep it counts
  (`invocations`); for one invocation at the end-to-end record's commit, the record's
  (reproduction.json: it adds the launches of an invocation stopped before run_info.json was
  written). Never both: a resumed run_info already holds the earlier launches."""
  record = _json(Path(results_root) / REPRODUCTION) or {}
  out = {}
  for n in experiments():
    if (info := _json(Path(results_root) / n / "run_info.json")) is not None:
      entry = record.get("experiments", {}).get(n)
      same = entry and info.get("commit") == record.get("commit")
      alone = int(info.get("invocations", 1)) <= 1
      out[n] = float((entry if same and alone else info)["launch_wall_s"])
  return out


def experiment_costs(results_root: Path) -> dict[str, float]:
  """{experiment: seconds that made its committed results}: a finished end-to-end record's wall
  time on each experiment it completed (every invocation's, at any of its commits: launches,
  follow-up analyses, figures; they sum to the record's wall time), else `launch_costs`
  (the launches that run_info.json counts: those at its own commit only)."""
  record = _json(Path(results_root) / REPRODUCTION) or {}
  done = record.get("experiments", {}) if record.get("finished") else {}
  ok = lambda e: str(e.get("status", "")).startswith("completed") and "wall_s" in e
  return {n: float(done[n]["wall_s"]) if n in done and ok(done[n]) else s
          for n, s in launch_costs(results_root).items()}


README_BEGIN, README_END = "<!-- claims:begin -->", "<!-- claims:end -->"
STALE = " (no commit recorded: re-run)"  # written before reports recorded their commit
NO_RULE = " (no stated rule: re-run)"
OLD_RULE = " (earlier rule: re-run)"  # decided by another rule than the module's RULE now
NO_GUARDS = " (before the guards: re-run)"  # decided before the validity guards were checked


def stale_mark(doc: dict, name: str | None = None) -> str:
  """What the claims table says beside a verdict whose report.json cannot vouch for it: no
  commit, no stated rule, a rule other than the `RULE` of the experiment's module now, or no
  validity guards (`pergrad.analysis.guards`) checked."""
  if not doc.get("commit"):
    return STALE
  if not doc.get("rule"):
    return NO_RULE
  exp = experiments().get(name) if name else None
  current = getattr(sys.modules.get(exp.report.__module__), "RULE", None) if exp else None
  if current is not None and current != doc["rule"]:
    return OLD_RULE
  return "" if "guards" in doc else NO_GUARDS


ROW = ("| {claim} | [`{n}`]({link}{n}/README.md) | {paper} | {ours} | **{r.verdict}**{mark} "
       "| {fa} | {power} | {figs} |")
CELL = 60  # characters of a claims-table cell (paper, ours): one line; the whole in its README


def one_line(text: str, limit: int = CELL) -> str:
  """`text` cut at its last "; " before `limit` characters, with " …" (the README has all)."""
  if len(text) <= limit:
    return text
  cut = text.rfind("; ", 0, limit)
  return (text[:cut] if cut > 0 else text[:limit].rsplit(" ", 1)[0]) + " …"


def claims_table(results_root: Path, link_prefix: str = "") -> str:
  """One short row per experiment (`ROW`): claim, the paper's figure, ours, verdict, the
  rule's false-alarm rate and power (from report.json), and the figures."""
  rate = lambda c, k: "—" if not c or c.get(k) is None or not math.isfinite(float(c[k])) \
      else f"{float(c[k]):.2f}"
  rows = ["| Claim | Experiment | Paper | Ours | Verdict | False alarm | Power | Figures |",
          "|---|---|---|---|---|---|---|---|"]
  for claim, names in claim_rows().items():
    for n in names:
      if (doc := _json(Path(results_root) / n / "report.json")) is None:
        rows.append(f"| {claim} | `{n}` | | not yet run | not yet run | — | — | — |")
        continue
      d = Report.from_json(doc)
      figs = " ".join(f"[{p.name}]({link_prefix}{n}/{p.name})"
                      for p in sorted((Path(results_root) / n).glob("*.png"))) or "—"
      rows.append(ROW.format(claim=claim, n=n, link=link_prefix, mark=stale_mark(doc, n),
                             r=d, paper=one_line(d.paper) or "—", figs=figs,
                             ours=one_line(d.ours),
                             fa=rate(d.calibration, "false_alarm"),
                             power=rate(d.calibration, "power")))
  return "\n".join(rows)


def _seeds(d: Path) -> str | None:
  """Seeds behind an experiment's reported numbers, from its CSVs ("2", "1-2")."""
  for csv in ("best.csv", "collapse.csv"):
    df = read_csv(d / csv)
    if "n_seeds" in df and (df["n_seeds"].fillna(0) > 0).any():  # else: selection seeds only
      lo, hi = int(df["n_seeds"].min()), int(df["n_seeds"].max())
      return str(lo) if lo == hi else f"{lo}-{hi}"
  df = read_csv(d / "finals.csv")
  return str(df["train.seed"].nunique()) if "train.seed" in df else None


SETUP = (
    "Setup (preset `{p}`, `configs/scale/{p}.yaml` over the defaults): the `{m[model]}` "
    "transformer ({m[n_layers]} layers, width {m[d_model]}, {m[n_heads]} heads, {params:,} "
    "parameters) on `{m[data]}` with a {m[vocab_size]}-token {m[tokenizer]} vocabulary, B = "
    "{m[batch_size]} sequences of T = {m[seq_len]} tokens, {m[steps]} steps (`batch_scaling` "
    "sets its own steps per batch size, `gns_ramp` its own smaller model: ~20 tokens per "
    "parameter, the `ladder` three smaller ones: `configs/scale/{p}_<rung>.yaml`), each "
    "experiment's own grids and learning rates (its "
    "README). Seeds behind the reported numbers: {seeds}. The committed results took {wall:.0f} "
    "min on 2 cores (per experiment: the cost table of `results/{p}/README.md`); "
    "`python scripts/reproduce.py all --preset {p}` regenerates them (resumable). The paper "
    "trained far larger models on TPUs: these are statements about this scale only.")


def claims_block(results_root: Path, link_prefix: str = "", preset: str = "cpu") -> str:
  """The setup paragraph (`SETUP`: the `preset` scale composed with the defaults, the seeds
  of the committed CSVs, the launch costs) and the claims table: the README's generated block."""
  from pergrad.analysis import n_params, scale_summary

  seeds = ((n, _seeds(Path(results_root) / n)) for n in experiments())
  setup = SETUP.format(p=preset, m=scale_summary([f"scale={preset}"]),
                       params=n_params([f"scale={preset}"]),
                       seeds=", ".join(f"{n} {s}" for n, s in seeds if s) or "none yet",
                       wall=sum(experiment_costs(results_root).values()) / 60)
  return setup + "\n\n" + LEGEND + "\n\n" + claims_table(results_root, link_prefix)


def render_readme(readme: Path = REPO / "README.md", results_root: Path = REPO / "results" / "cpu",
                  link_prefix: str = "results/cpu/") -> bool:
  """Rewrites the block of `readme` between README_BEGIN and README_END with `claims_block`
  (of the cpu results by default); returns whether the file changed."""
  text = Path(readme).read_text()
  if text.count(README_BEGIN) != 1 or text.count(README_END) != 1:
    raise ValueError(f"{readme} needs one {README_BEGIN} and one {README_END} line.")
  head, rest = text.split(README_BEGIN)
  new = (head + README_BEGIN + "\n" + claims_block(results_root, link_prefix) + "\n"
         + README_END + rest.split(README_END)[1])
  if new != text:
    Path(readme).write_text(new)
  return new != text


def readme_block(readme: Path = REPO / "README.md") -> str:
  """What `readme` holds between its markers (without them and the newlines around)."""
  return Path(readme).read_text().split(README_BEGIN, 1)[1].split(README_END, 1)[0].strip("\n")


INDEX = """# Results

The findings of Roulet & Agarwala (arXiv 2510.00236) and Gray et al. (arXiv 2411.00999) at \
the scale of a 2-core CPU machine, from runs actually made (`scripts/reproduce.py EXPERIMENT \
--preset {p}`): whether each *qualitative* finding holds at this small scale. Each \
experiment's README gives the rule, numbers, setup, figures and command.

{claims}

{reproduction}## Cost of each experiment ({p} preset, this machine)

| Experiment | Command | Wall time (min) | Completed runs |
|---|---|---|---|
{costs}

Wall times that made the committed results (often beside other jobs): the end-to-end \
record's where it completed the experiment (launches at any of its commits, analyses, \
figures), else the launches that the experiment's run_info.json counts. \
Regenerate: `python scripts/reproduce.py all --preset {p}` (resumable); redraw the figures \
from the CSVs: `notebooks/figures.ipynb`.
"""


def index_text(results_root: Path, preset: str) -> str:
  """results/<preset>/README.md (`INDEX`): the claims (`claims_block`) and each experiment's
  cost."""
  spent, rows = experiment_costs(results_root), []
  for n in experiments():
    d = _json(Path(results_root) / n / "run_info.json")
    rows.append(f"| `{n}` | `{d['command']}` | {spent[n] / 60:.1f} | {d['n_runs_completed']} |"
                if d else f"| `{n}` | `python scripts/reproduce.py {n} --preset {preset}` | "
                "not yet run | — |")
  rep = "".join(line + "\n" for line in reproduction_lines(results_root))
  record = _json(Path(results_root) / REPRODUCTION) or {}
  whole = record.get("finished") and spent == {  # every row the record's own
      n: float(e["wall_s"]) for n, e in record.get("experiments", {}).items() if n in spent}
  total = f"| total | | {sum(spent.values()) / 60:.1f} | " + (
      "the end-to-end record's wall time, experiment by experiment |" if whole else
      f"of the end-to-end record's {record['wall_s'] / 60:.1f} min |" if "wall_s" in record
      else "|")
  return INDEX.format(p=preset, claims=claims_block(results_root, preset=preset),
                      reproduction=rep, costs="\n".join([*rows, total]))


REPRODUCTION = "reproduction.json"  # written by `scripts/reproduce.py all`
REPRODUCED = """## The end-to-end reproduction

`{d[command]}`, from an empty sweeps directory{fresh}, at commit `{d[commit]}`{dirty}{resumed}: \
started {d[started]}, {end}, **{wall:.0f} min** of wall time on this 2-core machine.

| Experiment | Wall time (min) | Status |
|---|---|---|
{rows}
"""


def reproduction_lines(results_root: Path) -> list[str]:
  """The end-to-end record of results/reproduction.json (`REPRODUCED`), or nothing."""
  if (d := _json(Path(results_root) / REPRODUCTION)) is None:
    return []
  inv = d.get("invocations", [])
  resumed = (f" in {len(inv)} invocations of that command (each resumed the stopped one, "
             "skipping its finished runs; wall times "
             + " + ".join(f"{i['wall_s'] / 60:.0f}" for i in inv) + " min)"
             if len(inv) > 1 else "")
  # the invocations' commits, in order (records written before them: the record's own)
  commits = collections.Counter(i.get("commit", d["commit"]) for i in inv)
  if len(commits) > 1:
    resumed += (f"; at commits {', '.join(f'`{c[:7]}` ×{k}' for c, k in commits.items())}, "
                f"whose training code is the same (training version `{d.get('train_version')}`"
                ": the same runs), every report analysed at the last")
  if len(at := report_commits(results_root)) > 1:  # a report a later analysis did not redo
    resumed += (f"; its reports carry {len(at)} analysis commits, not one ("
                + ", ".join(f"`{c[:7]}`: {', '.join(v) if len(v) < 4 else f'{len(v)} reports'}"
                            for c, v in at.items()) + ")")
  end = (f"finished {d['finished']}" if d.get("finished")
         else "NOT finished (stopped" + (f" during `{d['running']['name']}`"
                                         if d.get("running") else "") + ")")
  return REPRODUCED.format(
      d=d, fresh="" if d.get("fresh") else " (NOT empty: some runs were skipped as finished)",
      dirty=" with uncommitted changes" if d.get("clean") is False else "", resumed=resumed,
      end=end, wall=d["wall_s"] / 60, rows="\n".join(
          f"| `{n}` | {e['wall_s'] / 60:.1f} | {e['status']} |"
          for n, e in d["experiments"].items())).split("\n")


SWEEPS_ROOT = "<sweeps-root>"  # what results/ says for this machine's sweeps directory


def portable_sweep_dir(sweep_dir) -> str:
  """A sweep directory as results/ records it: relative to the repository when inside it,
  else `<sweeps-root>/<experiment>/<preset>` (no machine's path)."""
  p = Path(sweep_dir)
  r = p.resolve()
  if r.is_relative_to(REPO):
    return str(r.relative_to(REPO))
  return str(Path(SWEEPS_ROOT, *p.parts[-2:])) if p.is_absolute() else str(p)


def portable_command(command: str) -> str:
  """`command` with the value of --sweeps-root (an absolute path) as `<sweeps-root>`."""
  return re.sub(r"(--sweeps-root[= ])(/\S*)", rf"\g<1>{SWEEPS_ROOT}", command)


def portable_results(results_root: Path) -> list[Path]:
  """Rewrites the run_info.json, reproduction.json and experiment READMEs under `results_root`
  that name an absolute sweeps directory with `<sweeps-root>` instead; returns those changed."""
  changed, roots = [], set()
  for info_path in sorted(Path(results_root).glob("*/run_info.json")):
    info = json.loads(info_path.read_text())
    if Path(info.get("sweep_dir", "")).is_absolute():
      roots.add(str(Path(info["sweep_dir"]).parents[1]))
  for path in [*Path(results_root).glob("*/run_info.json"), Path(results_root) / REPRODUCTION,
               *Path(results_root).glob("*/README.md")]:
    if not path.exists():
      continue
    text = old = path.read_text()
    for root in sorted(roots, key=len, reverse=True):
      text = text.replace(root + "/", SWEEPS_ROOT + "/").replace(root, SWEEPS_ROOT)
    if path.suffix == ".json":
      doc = json.loads(text)
      doc |= {k: portable_command(doc[k]) for k in ("command",) if k in doc}
      doc |= {k: portable_sweep_dir(doc[k]) for k in ("sweep_dir",) if k in doc}
      text = json.dumps(doc, indent=1)
    if text != old:
      path.write_text(text)
      changed.append(path)
  return changed


def write_index(results_root: Path, preset: str) -> Path:
  """Writes results/<preset>/README.md (`index_text`), from that preset's results only, after
  `portable_results` (no machine's path in results/)."""
  portable_results(results_root)
  path = Path(results_root) / "README.md"
  path.write_text(index_text(results_root, preset))
  return path
