"""The paper's experiments: one module per experiment, and the machinery they share.

  record      Experiment (one per module, registered), the registry, provenance
  sweep       Block / LrSearch / Sweep, run and sweep directory names, scale presets
  launch      Hydra multiruns of `python -m pergrad.train`, skipping finished runs
  runs        reading run directories: status, metrics tables, final numbers
  lr_search   best learning rate per variant, follow-up stages, their CSVs and figures
  rules       decision rules on seeds; calibrate: their simulated error rates
  verdict     Report and the finding templates; report_md: READMEs and the claims table
  leafwise    per-leaf views and sign counts; figures: matplotlib helpers
  runner      one experiment end to end (what `scripts/reproduce.py` calls)
"""
