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

Every backend's per-example statistics need separable per-example losses (loss_b depends
on example b alone); `compute` checks it once per model and shape, before any statistic
(`separable.py`: each loss_b bit for bit unchanged when every other example changes, at 4
examples; a dependence inactive at the point checked is not seen), and refuses a model that
mixes examples (h - h.mean(0), BatchNorm in training mode, pooling, sort or cumsum over the
batch, a loss normalised by a batch statistic) on every backend, auto included (vmap is
wrong there too), in one line naming the operation and the user's line:

    ps.compute(loss_fn_with_batchnorm, params, batch, want=("sq",))
    # Unsupported: pergrad.stats: the per-example losses are not separable (example 0's
    # loss changes when the other examples change: first at reduce_sum at model.py:40 ...),
    # so no backend computes their per-example gradients; compute batch statistics outside
    # the per-example loss (...), or use per-example normalization (...).
vmap and the loop also need each example's loss alone to be its batch row (`alone.py`: a
loss divided by the batch's size or drawing randomness per batch is refused there).

The mean alone (`want=("mean",)`) is the batch loss's gradient, exact for any model.

Surgery is exact or refused, leaf by leaf, proved once per model from its jaxpr at trace
time (`surgery/proof.py`):
  supports: Dense / DenseGeneral / LinearGeneral (no batch axes), nnx.Einsum of a dense
    form, Embed (lookup, attend, one table tied by both), LayerNorm / RMSNorm over the last
    axis, the `taps` functions; inputs positional or by keyword; a table looked up on ids
    without the example axis whose output is broadcast against the batch (x + E[arange(T)]);
  refuses (`surgery.Unsupported`, one line naming the leaf and the use): a parameter that
    reaches the loss outside its layer calls (x @ W.T, λ‖W‖² in the loss), a layer called
    twice on the same arrays (shared weights; but a tied table), a layer's parameter
    computed inside loss_fn (w.astype(...), a teacher on stop_gradient(params); a teacher
    closed over is a constant, exact), a layer call under jax.vmap, scan (nn.scan, nnx.scan),
    remat, cond or custom_vjp or differentiated inside loss_fn, a layer input whose
    example axis cannot be found, a table on ids without the example axis whose output is
    used otherwise (an ALiBi slope table sliced, a [T, T, H] relative bias transposed).
backend="surgery" refuses such a model; backend="auto" (`decide`) keeps surgery for the
proven leaves and takes the refused ones' per-example gradients from vmap
("surgery_vmap"), or runs vmap for the whole model where no leaf is proven (or with
per-example clipping), warning once:

    ps.compute(loss_fn_with_penalty, params, batch, want=("sq",))
    # UserWarning: pergrad.stats: surgery is not exact for this model ('w/kernel': it
    # reaches the loss outside its layer calls (used by square), ...); backend='auto' takes
    # the refused leaves' per-example gradients from vmap (backend='surgery_vmap', ...).
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
