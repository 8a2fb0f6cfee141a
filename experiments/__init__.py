"""The paper's experiments, one module per experiment (registered in `record`), and the
machinery they share: sweeps and launches, run tables, decision rules, reports."""
