"""Every committed report re-renders byte-identical from the committed CSVs (`rerender`), but
for the files that read sweeps not committed (runs/): the READMEs' setup of experiments that
`need` another's tuned lr (placeholders without its runs), msq_eps's inherited guard (it reads
preconditioner's sweep), and lr_exponent's noise estimate (last digit of a float sum)."""

from __future__ import annotations

import pytest
from rerender import differing

NEED_SWEEPS = {
    *(f"results/cpu/{n}/README.md" for n in ("batch_scaling", "gns_layers", "lr_exponent",
                                             "moments", "msq_eps", "snr")),
    *(f"results/cpu/ladder/{r}/{n}/README.md" for r in ("s", "xs", "xxs")
      for n in ("gns_layers", "moments")),
    *(f"results/cpu/{p}lr_exponent/report.json" for p in ("", "ladder/s/", "ladder/xs/",
                                                          "ladder/xxs/")),
    "results/cpu/msq_eps/report.json",
}


@pytest.mark.extended
def test_every_committed_report_rerenders_byte_identical():
  assert set(differing()) <= NEED_SWEEPS
