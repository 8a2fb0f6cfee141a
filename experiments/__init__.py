"""The papers' experiments, one module per experiment (registered in `record`), and the
machinery they share: sweeps, the lr search, launches, the runner, report templates. They read
runs and decide with `pergrad.analysis` (run tables, rules and their error rates, plots)."""
