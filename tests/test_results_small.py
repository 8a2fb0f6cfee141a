"""results/ stays small: long tables are written gzip-compressed with reproducible bytes and
read back as they were written (`pergrad.analysis.runs.write_csv` / `read_csv`); the committed
results/ stays under its bounds."""

from __future__ import annotations

import numpy as np
import pandas as pd

from pergrad.analysis.runs import LONG_ROWS, read_csv, write_csv


def test_a_long_table_is_gzipped_reproducibly_and_reads_back(tmp_path):
  rng = np.random.default_rng(0)
  long = pd.DataFrame({"step": np.arange(LONG_ROWS + 1), "value": rng.random(LONG_ROWS + 1),
                       "leaf": "block_0/attn/key/kernel"})
  first = write_csv(long, tmp_path / "t.csv")
  assert first.name == "t.csv.gz" and not (tmp_path / "t.csv").exists()
  data = first.read_bytes()
  write_csv(long, tmp_path / "t.csv")
  assert first.read_bytes() == data  # no time in the gzip header
  back = read_csv(tmp_path / "t.csv")
  pd.testing.assert_frame_equal(back, pd.read_csv(tmp_path / "t.csv.gz"))
  assert np.array_equal(back["value"].to_numpy(), long["value"].to_numpy())


def test_a_short_table_stays_plain_and_replaces_a_stale_long_one(tmp_path):
  write_csv(pd.DataFrame({"x": np.arange(LONG_ROWS + 1)}), tmp_path / "t.csv")
  write_csv(pd.DataFrame({"x": [1, 2]}), tmp_path / "t.csv")
  assert sorted(p.name for p in tmp_path.iterdir()) == ["t.csv"]
  assert read_csv(tmp_path / "t.csv")["x"].tolist() == [1, 2]
  assert read_csv(tmp_path / "missing.csv").empty
  (tmp_path / "empty.csv").write_text("\n")
  assert read_csv(tmp_path / "empty.csv").empty


def test_committed_results_stay_small():
  """Issue 53's bound on results/: no file over 1 MB, all of it under 8 MB."""
  from pathlib import Path

  files = [p for p in (Path(__file__).resolve().parents[1] / "results").rglob("*") if p.is_file()]
  big = [str(p) for p in files if p.stat().st_size > 1_000_000]
  assert not big, f"over 1 MB in results/: {big}"
  assert sum(p.stat().st_size for p in files) < 8_000_000
