"""Every logged key of a short run keeps its name and value across the optimizer's
refactor of issue 38 (ε handed to the diagnostics by the optimizer, not held in its
chain): tests/diagnostics_golden.json holds the train and stats records of the same runs
written at fedd7d1, before it (`python tests/test_diagnostics_kept.py --write` rewrites
it).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
from conftest import TINY, compose

from pergrad.config import build_plan
from pergrad.train.loop import run
from pergrad.train.metrics import read_records

GOLDEN = Path(__file__).with_name("diagnostics_golden.json")
COMMON = ("train.steps=3", "train.eval_every=0", "train.checkpoint_every=0",
          "logging.log_every=1", "stats.log_every=1", "stats.track_snr=true",
          "logging.figure=false")
RUNS = {  # name -> overrides: ε at the scale of √v̂, so that 0 < eps_share < 1
    "micro_adam_msq": ("optimizer=adam_family", "optimizer.variant=micro_adam_msq",
                       "optimizer.eps=3e-3", "optimizer.clip_norm=1.0"),
    "adamw": ("optimizer=adamw", "optimizer.eps=1e-3", "optimizer.weight_decay=0.1"),
}
VOLATILE = ("tokens_per_s", "train_time_s")  # wall-clock


def _records(name: str, out_dir: Path, tfds_dir: Path) -> list[dict]:
  plan = build_plan(compose([*TINY, f"data.tfds_dir={tfds_dir}", *COMMON, *RUNS[name]]))
  run(plan, out_dir, echo=lambda _: None)
  return [{k: v for k, v in r.items() if k not in VOLATILE}
          for r in read_records(out_dir / "metrics.jsonl") if r.get("split") != "eval"]


@pytest.mark.extended  # ~40 s a run on 2 cores, mostly compiling; in the main suite
@pytest.mark.parametrize("name", list(RUNS))  # test_eps_share checks the values to NumPy
def test_logged_metrics_keep_their_names_and_values(name, tfds_dir, tmp_path, compilation_cache):
  want = json.loads(GOLDEN.read_text())[name]
  got = _records(name, tmp_path / name, tfds_dir)
  assert len(got) == len(want)
  for g, w in zip(got, want, strict=True):
    assert sorted(g) == sorted(w), set(g) ^ set(w)
    assert any(k.endswith("/eps_share") for k in g) or g["split"] == "train"
    for key, value in w.items():
      if isinstance(value, float) and not math.isnan(value):
        assert g[key] == pytest.approx(value, rel=1e-5, abs=1e-7), (g["step"], key)
      else:
        assert g[key] == value, (g["step"], key)


if __name__ == "__main__" and sys.argv[1:] == ["--write"]:
  import tempfile

  from pergrad.data import make_data

  with tempfile.TemporaryDirectory() as tmp:
    make_data(build_plan(compose([*TINY, f"data.tfds_dir={tmp}/tfds"])).data)
    GOLDEN.write_text(json.dumps({n: _records(n, Path(tmp) / n, Path(tmp) / "tfds")
                                  for n in RUNS}, indent=1) + "\n")
