"""Run metrics: one JSON object per line in `<run dir>/metrics.jsonl`, mirrored to W&B.

Records:
    {"step": k, "split": "train", "loss", "lr", "grad_norm", "tokens_per_s", "examples_seen", ...}
    {"step": k, "split": "eval", "loss"}
    {"step": k, "split": "stats", "stats/<leaf>/<name>": v, "opt/<leaf>/<name>": v, ...}

and, every step of a run that tracks the gradient noise scale, "gns/<group>/<name>" in
the stats record (`pergrad.optim.noise_scale.gns_metrics`); `pergrad.analysis.resmooth`
recomputes its B_simple offline from the logged raw terms with any EMA decay.

The local file is always written, so analysis never depends on W&B. W&B runs in
the mode of `logging.wandb.mode` (offline by default: no account, no network; its
files land in `<run dir>/wandb/offline-run-*`, uploadable with `wandb sync`). Any
W&B exception, at init or log, prints one warning and W&B is dropped for the rest of
the run; training continues.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pergrad import files
from pergrad.files import METRICS, read_records


def _plain(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)) and np.ndim(v) == 0:
    v = v.item()
  if isinstance(v, float) and math.isfinite(v):
    # 9 significant digits round-trip a float32 exactly (what the device computed), so
    # offline recomputations from metrics.jsonl (`pergrad.analysis.resmooth`) are exact.
    return float(f"{v:.9g}")
  return v


def truncate(path: str | Path, last_step: int) -> int:
  """Keeps only records with step <= last_step (so a resumed run logs no duplicates).

  Returns the number of records dropped. last_step = -1 empties the file.
  """
  path = Path(path)
  if not path.exists():
    return 0
  recs = read_records(path)
  keep = [r for r in recs if r["step"] <= last_step]
  files.write_text(path, "".join(json.dumps(r) + "\n" for r in keep))
  return len(recs) - len(keep)


class MetricsLogger:
  """Appends records to metrics.jsonl and logs them to W&B (if it works)."""

  def __init__(self, run_dir: str | Path, *, resume_step: int | None, wandb: Any = None,
               config: dict | None = None, name: str | None = None, enabled: bool = True):
    """`enabled=False` (processes other than 0 of a multi-process run): writes nothing."""
    self.run_dir = Path(run_dir)
    self.path = self.run_dir / METRICS
    self.enabled = enabled
    self._file = None
    self.wandb_dir: Path | None = None
    self._wandb = None
    if not enabled:
      return
    truncate(self.path, -1 if resume_step is None else resume_step)
    self._file = open(self.path, "a")
    if wandb is not None and wandb.mode != "disabled":
      self._init_wandb(wandb, config or {}, name)

  # ------------------------------------------------------------------ W&B
  def _warn(self, what: str, e: Exception) -> None:
    msg = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    print(f"[warning] W&B {what} failed ({type(e).__name__}: {msg}); continuing with "
          f"{self.path} only.", file=sys.stderr)

  def _init_wandb(self, cfg: Any, config: dict, name: str | None) -> None:
    try:
      import wandb

      self._wandb = wandb.init(
          project=cfg.project, entity=cfg.entity, group=cfg.group, tags=list(cfg.tags or []),
          name=name, mode=cfg.mode, dir=str(self.run_dir), config=config,
          settings=wandb.Settings(console="off", silent=True))
      self.wandb_dir = Path(self._wandb.dir).parent if self._wandb is not None else None
    except Exception as e:  # noqa: BLE001 - W&B must never stop training
      self._warn("init", e)
      self._wandb = None

  # ------------------------------------------------------------------ records
  def write(self, record: dict) -> None:
    if not self.enabled:
      return
    record = {k: _plain(v) for k, v in record.items()}
    self._file.write(json.dumps(record) + "\n")
    self._file.flush()
    if self._wandb is not None:
      split = record.get("split", "train")
      data = {(k if "/" in k else f"{split}/{k}"): v for k, v in record.items()
              if k not in ("step", "split")}
      try:
        self._wandb.log(data, step=int(record["step"]))
      except Exception as e:  # noqa: BLE001
        self._warn("log", e)
        self._wandb = None

  def summary(self, values: dict) -> None:
    if self._wandb is not None:
      try:
        self._wandb.summary.update({k: _plain(v) for k, v in values.items()})
      except Exception as e:  # noqa: BLE001
        self._warn("summary", e)

  def close(self, exit_code: int = 0) -> None:
    if self._file is not None:
      self._file.close()
    if self._wandb is not None:
      try:
        self._wandb.finish(exit_code=exit_code)
      except Exception as e:  # noqa: BLE001
        self._warn("finish", e)
      self._wandb = None
