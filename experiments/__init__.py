"""The papers' experiments, one module per experiment (registered in `record`), and the
machinery they share: the lr search, the runner, report templates. They declare, launch and
reuse their runs with `pergrad.sweep`, read them and decide with `pergrad.analysis` (run
tables, rules and their error rates, plots)."""
