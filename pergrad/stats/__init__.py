"""Per-example / per-token gradient statistics (see `api.compute`).

    import pergrad.stats as ps
    loss, stats = ps.compute(loss_fn, params, batch, want=("mean", "sq", "sign", "norms"))
    loss, stats = ps.compute(loss_fn, params, batch, request, ps.StatsOptions(microbatch_size=4))
    stats.mean, stats.variance, stats.sign_mean, stats.sq_norms
    ps.summaries.layer_summaries(stats)   # scalars for logging

What: a `StatsRequest`; how: a `StatsOptions`; by which backend: a name of the table
`backends.REGISTRY`, every entry fn(loss_fn, params, batch, request, options).
The surgery backend takes Flax Linen and Flax NNX models as they are, and plain-JAX
models that call `pergrad.stats.taps` (dense, embed, attend, layer_norm, rms_norm).
"""

from pergrad.stats import backends, summaries, taps
from pergrad.stats.api import check_microbatch, compute, resolve_backend
from pergrad.stats.backends import Backend, register_backend, unregister_backend
from pergrad.stats.options import StatsOptions
from pergrad.stats.registry import Statistic, register, unregister
from pergrad.stats.request import Granularity, StatsRequest
from pergrad.stats.types import STATISTICS, GradStats

__all__ = [
    "Granularity", "STATISTICS", "Backend", "GradStats", "StatsOptions",
    "StatsRequest", "Statistic", "backends", "check_microbatch", "compute", "register",
    "register_backend", "resolve_backend", "summaries", "taps", "unregister",
    "unregister_backend",
]
