"""Per-example / per-token gradient statistics (see `api.compute`).

    import pergrad.stats as ps
    loss, stats = ps.compute(loss_fn, params, batch, want=("mean", "sq", "sign", "norms"))
    loss, stats = ps.compute(loss_fn, params, batch, request, ps.StatsOptions(microbatch_size=4))
    stats.mean, stats.variance, stats.sign_mean, stats.sq_norms
    ps.summaries.layer_summaries(stats)   # scalars for logging

What: a `StatsRequest`; how: a `StatsOptions`; by which backend: a name of the table
`backends.REGISTRY`, every entry fn(loss_fn, params, batch, request, options).
Preconditions, checked by `compute` once per model and shape, before any statistic: the
per-example losses are separable, loss_b depending on example b alone (`separable.py`; a
model that mixes examples is refused on every backend, auto included), and for vmap and the
loop each example's loss alone is its batch row (`alone.py`). The mean alone
(`want=("mean",)`) is the batch loss's gradient, exact for any model, unchecked.
Surgery is exact or refused, leaf by leaf, proved once per model from its jaxpr
(`surgery/proof.py`); backend="auto" takes the refused leaves (or the whole model) from
vmap, warning once. The models each backend takes, what it refuses and the one-line
errors: README.md, "What is computed".
"""

from pergrad.stats import backends, summaries, taps
from pergrad.stats.api import check_microbatch, compute, decide, resolve_backend
from pergrad.stats.backends import Backend, register_backend, unregister_backend
from pergrad.stats.options import StatsOptions
from pergrad.stats.registry import Statistic, register, unregister
from pergrad.stats.request import Granularity, StatsRequest
from pergrad.stats.types import STATISTICS, GradStats

__all__ = [
    "Granularity", "STATISTICS", "Backend", "GradStats", "StatsOptions",
    "StatsRequest", "Statistic", "backends", "check_microbatch", "compute", "decide", "register",
    "register_backend", "resolve_backend", "summaries", "taps", "unregister",
    "unregister_backend",
]
