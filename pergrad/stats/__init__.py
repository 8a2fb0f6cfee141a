"""Per-example / per-token gradient statistics (see `api.compute`).

    import pergrad.stats as ps
    loss, stats = ps.compute(loss_fn, params, batch, want=("mean", "sq", "sign", "norms"))
    stats.mean, stats.variance, stats.sign_mean, stats.sq_norms
    ps.summaries.layer_summaries(stats)   # scalars for logging
"""

from pergrad.stats import summaries
from pergrad.stats.api import BACKENDS, check_microbatch, compute, resolve_backend
from pergrad.stats.registry import Statistic, register, unregister
from pergrad.stats.request import GRANULARITIES, StatsRequest
from pergrad.stats.types import STATISTICS, GradStats

__all__ = [
    "BACKENDS", "GRANULARITIES", "STATISTICS", "GradStats", "StatsRequest", "check_microbatch",
    "Statistic", "compute", "register", "resolve_backend", "summaries", "unregister",
]
