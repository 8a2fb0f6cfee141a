"""Benchmarks: the cost of gradient statistics (`stats`) and XLA's accounting (`xla_costs`)."""
