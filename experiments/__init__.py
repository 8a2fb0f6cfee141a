"""The paper's experiments: one module per experiment, and the machinery they share.

  record      Experiment (one per module, registered), Report, the registry, provenance
  sweep       Block / LrSearch / Sweep, run and sweep directory names, scale presets
  launch      Hydra multiruns of `python -m pergrad.train`, skipping finished runs
  runs        reading run directories: status, metrics tables, final numbers
  lr_search   best learning rate per variant, follow-up stages, their CSVs and figures
  figures     matplotlib helpers
  report_md   Markdown: tables, each experiment's README, the results index
  runner      one experiment end to end (what `scripts/reproduce.py` calls)
"""
