"""The rows of the claims table (README.md, results/<preset>/README.md): one per claim of the
papers, decided by the paper's own test, then one per comparison of ours beside it."""

from __future__ import annotations

from experiments.record import experiments

# The claims table (issue 40): one row per claim, its verdict the paper's own test's, then one
# row per comparison of ours beside it; a plugin's experiment gets its own row (`exp.row`).
PAPERS_TEST = {
    "overhead": "C1. Per-example statistics are cheap",
    "sign_placement": "C2. The later the sign, the better",
    "preconditioner": "C3. A μ²-dominated preconditioner is best",
    "batch_scaling": "C4. √B lr scaling collapses the curves",
    "norm_cost": "G1. Every layer's per-example norms, cheaply",
    "gns_layers": "G2. The norm layers' GNS predicts the total",
    "gns_ramp": "G3. A linear batch ramp saves 18 % of tokens",
}
OURS = {
    "snr": "C2, ours: the SNR of each sign placement",
    "msq_eps": "C3, ours: MicroAdamMSQ at its tuned ε vs Adam",
    "moments": "C3c, ours: μ² against σ²/B in Adam's v",
    "lr_exponent": "C4, ours: the exponent α of lr*(B)",
    "gns_schedule": "G3, ours: GNS schedules vs the best fixed B",
    "ladder": "Ours: C3c, C4, G2, G3 across 3 model sizes",
}
LEGEND = ("Rows C1-G3: the paper's own test, which decides the claim's verdict; rows marked "
          "\"ours\": our comparisons beside it, not counted toward the claim. A failed validity "
          "guard reads \"undetermined: <guard>\". The rule, numbers and guards of each row are "
          "in its experiment's README.")


def claim_rows() -> dict[str, tuple]:
  """{row of the claims table: the experiments in it}: the paper's tests (`PAPERS_TEST`), our
  comparisons (`OURS`), then plugins' rows, each in registration order."""
  names = experiments()
  rows: dict[str, tuple] = {PAPERS_TEST[n]: (n,) for n in PAPERS_TEST if n in names}
  rows |= {OURS[n]: (n,) for n in OURS if n in names}
  for name, exp in names.items():
    if name not in PAPERS_TEST and name not in OURS:
      rows[exp.row] = (*rows.get(exp.row, ()), name)
  return rows
