"""Every committed report re-renders byte-identical from the committed results/ alone
(`rerender`: the CSVs, each report's run_info.json with the setup its live sweeps gave, the
neighbouring reports a report reads), the README's claims block and the results index too."""

from __future__ import annotations

import pytest
from rerender import differing


@pytest.mark.extended
def test_every_committed_report_rerenders_byte_identical():
  assert differing() == []
