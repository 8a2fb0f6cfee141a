"""A run's figure, drawn from its `metrics.jsonl`: `plot_run(run_dir) -> curves.png`, titled
with the run's name and what sets it apart (its `config.yaml`: model, optimizer, lr, B, seed).

Panel 1: train and eval loss against tokens seen. When statistics were logged, one
more panel per summary (`SUMMARIES`, the first ones present), one line per layer
("<prefix>/<leaf>/<name>" records, the median over a layer's parameter leaves).
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import yaml

from pergrad.config.plan import CONFIG
from pergrad.files import METRICS, read_records

FIGURE = "curves.png"
# Per-layer (prefix, name) worth a look, in order of preference: the optimizer diagnostics
# (pergrad.optim.diagnostics) and the statistics' summaries (pergrad.stats.summaries).
SUMMARIES = (("opt", "snr2_batch"), ("stats", "frac_mean_dominated"), ("stats", "var_mean"),
             ("stats", "norm_p50"))
WHOLE = ("stats/total/", "opt/all/")  # whole-model keys: not a layer
MAX_PANELS = 2


def _layer(leaf: str) -> str:
  """'block_0/mlp/fc1/kernel' -> 'block_0/mlp/fc1' (a layer holds kernel, bias, ...)."""
  return leaf.rsplit("/", 1)[0] if "/" in leaf else leaf


def title(run_dir: Path) -> str:
  """'<name> (<experiment>)' over 'model=… optimizer=… lr=… B=… seed=…', from the run's
  config.yaml (the folder's name when there is none)."""
  path = Path(run_dir) / CONFIG
  if not path.exists():
    return Path(run_dir).name
  cfg = yaml.safe_load(path.read_text())
  opt = cfg["optimizer"]
  kind = "/".join(str(opt[k]) for k in ("name", "placement", "variant") if k in opt)
  name = cfg.get("name", "run") + (f" ({cfg['experiment']})" if cfg.get("experiment") else "")
  return (f"{name}\nmodel={cfg['model']['name']} optimizer={kind} lr={opt['lr']:g} "
          f"B={cfg['data']['batch_size']} T={cfg['data']['seq_len']} seed={cfg['train']['seed']}")


def plot_run(run_dir: str | Path) -> Path:
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  import numpy as np

  run_dir = Path(run_dir)
  recs = read_records(run_dir / METRICS)
  train = [r for r in recs if r.get("split") == "train"]
  tokens_per_step = train[-1]["tokens_seen"] / train[-1]["step"] if train else 0.0
  stats = [r for r in recs if r.get("split") == "stats"]
  names = [(p, n) for p, n in SUMMARIES
           if stats and any(k.startswith(p + "/") and k.endswith("/" + n) for k in stats[-1])]
  names = names[:MAX_PANELS]
  fig, axes = plt.subplots(1, 1 + len(names), figsize=(4.5 * (1 + len(names)), 3.4),
                           squeeze=False)
  ax = axes[0, 0]
  ax.plot([r["tokens_seen"] for r in train], [r["loss"] for r in train], label="train")
  evals = [r for r in recs if r.get("split") == "eval"]
  ax.plot([r["step"] * tokens_per_step for r in evals], [r["loss"] for r in evals], "o-",
          label="eval")
  ax.set(xlabel="tokens", ylabel="loss")
  fig.suptitle(title(run_dir), fontsize=9)
  ax.legend()
  for ax, (prefix, name) in zip(axes[0, 1:], names, strict=True):
    series = defaultdict(lambda: defaultdict(list))  # layer -> step -> values of its leaves
    for r in stats:
      for k, v in r.items():
        if (k.startswith(prefix + "/") and k.endswith("/" + name)
            and not k.startswith(WHOLE)):
          series[_layer(k[len(prefix) + 1:-len(name) - 1])][r["step"]].append(v)
    for layer, by_step in sorted(series.items()):
      steps = sorted(by_step)
      ax.plot([s * tokens_per_step for s in steps], [np.median(by_step[s]) for s in steps],
              label=layer, lw=1)
    ax.set(xlabel="tokens", title=name)
    if name.startswith("norm"):
      ax.set_yscale("log")
    ax.legend(fontsize=5, ncol=2)
  fig.tight_layout()
  path = run_dir / FIGURE
  fig.savefig(path, dpi=110)
  plt.close(fig)
  return path
