"""Analysis of pergrad runs: what analysis code (the `experiments` package, notebooks, your own
scripts) calls. NumPy/pandas only: importing it, or reading a table, imports no JAX; the
functions that compose a config or build a model's shapes import the library in the call.

  runs        a sweep's run directories as one tidy table, finals, where a curve reaches a target
  leafwise    per-leaf tables of the logged `opt/`, `stats/` and `sign/` keys
  rules       decision rules over seeds, each stated in English beside its code
  calibrate   each rule's false-alarm rate and power, simulated at a comparison's own noise
  guards      validity guards checked before any verdict
  plots       matplotlib helpers
  gns_terms   the GNS tracker's recurrence offline (`smooth`, `resmooth`), `ema_gain`
  sizes       the composed config (`composed`, `scale_summary`) and its model's sizes
              (`n_params`, `leaf_sizes`)

The statistics benchmark is `pergrad.bench.stats` (analysis does not import it).
"""

from __future__ import annotations

from pergrad.analysis.gns_terms import GNS_TOTAL, ema_gain, resmooth, smooth
from pergrad.analysis.sizes import composed, identity, leaf_sizes, n_params, scale_summary
from pergrad.files import read_records
from pergrad.layer_types import layer_type

__all__ = ["GNS_TOTAL", "composed", "ema_gain", "identity", "layer_type", "leaf_sizes", "n_params",
           "read_records", "resmooth", "scale_summary", "smooth"]
