"""The precondition of backends that run each example alone: its loss is its batch row.

vmap and the loop compute g_b = ∇_θ loss_fn(θ, batch_b)[0], example b run as a batch of
one. That is the gradient of the batch's own per-example loss ℓ_b(θ; batch) only when
ℓ_b is the same alone: not when it depends on the batch's size (a hand-written mean
`tok_loss.sum(-1) / x.shape[0]`: alone it is B times its row) or on randomness drawn per
batch (`nn.Dropout` with one rng: a batch of one draws another mask than row b of the
batch's). Separability (`separable.check`) does not see either: ℓ_b does not change with
the other examples.

`check_alone` compares, once per loss_fn and shapes, at B' = min(B, 4) examples, the
batch's losses ℓ(θ; batch)_b with vmap's ℓ(θ; batch_b) and refuses
|Δ_b| > RTOL·(|ℓ_b| + mean_j |ℓ_j|), RTOL = max(floor, 4 ε) with ε the machine epsilon of
the least precise float in loss_fn. Caveat: randomness whose effect on every ℓ_b is below
RTOL is not seen.
"""

from __future__ import annotations

import jax
import jax.extend.core as jcore
import jax.numpy as jnp
import numpy as np

from pergrad.stats import separable
from pergrad.stats.surgery.proof import Unsupported
from pergrad.stats.surgery.memo import memo
from pergrad.stats.vmap import example_loss

# Batches of one may sum in another order: 4096 float32 roundings (u = 2⁻²⁴); a batch-size
# factor B' ≥ 2 moves ℓ_b by far more.
RTOL_FLOOR = 2.0 ** -12
# loss_fn draws random numbers: a dropout mask on one small layer can move ℓ_b by less than
# RTOL_FLOOR, while the fuzzer's deterministic losses agree bit for bit alone and in a batch.
RTOL_FLOOR_DRAWS = 2.0 ** -16
RANDOM = frozenset({"random_bits", "threefry2x32", "random_seed", "random_wrap",
                    "rng_bit_generator"})
FIX = ("divide by a constant, not by the batch's size (x.shape[0]), and draw randomness per "
       "example from the batch (jax.random.fold_in(key, an example id in the batch), or one key "
       "per example, jax.random.split(key, B), passed in the batch); or use backend='surgery' "
       "(or 'auto'), which differentiates the batch's own per-example losses")


def refusal(reason: str) -> Unsupported:
  """The refusal, one line: the cause and the fix."""
  err = Unsupported(f"pergrad.stats: backend 'vmap' (and 'loop', and 'surgery_vmap' for the "
                    f"leaves surgery refuses) runs each example alone, and this loss_fn's "
                    f"per-example losses are not the same alone ({reason}); {FIX}.")
  err.reason = reason
  return err


@memo
def check_alone(loss_fn, params, batch) -> None:
  """Raises `refusal(...)` unless each example's loss computed alone (vmap over batches of
  one) is its row of the batch's (module docstring). B = 1 passes. Once per loss_fn and
  shapes (`memo.memo`), at B' = min(B, 4) examples: the first B' of the batch and the
  params where concrete, stand-ins where traced, as `separable` does; one compiled program
  (one forward of B' examples and one of B' batches of one). The floor of RTOL is
  `RTOL_FLOOR`, or `RTOL_FLOOR_DRAWS` when loss_fn draws random numbers."""
  separable.at_few_examples(
      batch, lambda n: _check_at(loss_fn, params, batch, n),
      "whether each example's loss alone is its row of the batch's: loss_fn did not run as a "
      "batch and as batches of one at {B} examples ({error}); use backend='surgery' (or "
      "'auto')")


def _check_at(loss_fn, params, batch, n: int) -> None:
  given = separable.given_values(params, batch, n)

  def both(p_given, b_given):
    p, b = separable.stand_ins(params, batch, p_given, b_given, n)
    return loss_fn(p, b), jax.vmap(example_loss(loss_fn), in_axes=(None, 0))(p, b)

  traced = jax.jit(both).trace(*given)  # one trace: the program and its jaxpr
  whole, alone = (np.asarray(x, np.float64)
                  for x in traced.lower().compile(separable.fast_options())(*given))
  closed = traced.jaxpr
  draws = _draws(closed.jaxpr)
  rtol = max(RTOL_FLOOR_DRAWS if draws else RTOL_FLOOR, 4 * _least_eps(closed.jaxpr))
  scale = np.abs(whole) + np.mean(np.abs(whole))
  off = ~((np.abs(alone - whole) <= rtol * scale) | (alone == whole)
          | (np.isnan(alone) & np.isnan(whole)))
  if off.any():
    raise refusal(_cause(whole, alone, rtol, n, int(np.argmax(off)), draws))


def _cause(whole, alone, rtol: float, n: int, j: int, draws: bool) -> str:
  """The difference, in words: a common factor (the batch's size), randomness, or values."""
  with np.errstate(divide="ignore", invalid="ignore"):
    ratio = alone / whole
  if np.all(np.isfinite(ratio)) and np.ptp(ratio) <= rtol * np.abs(ratio).max():
    return (f"each example's loss alone is {ratio[0]:.4g}x its row in a batch of {n}: the loss "
            "depends on the batch's size")
  what = (": loss_fn draws random numbers per batch, e.g. a dropout mask for the whole batch"
          if draws else "")
  return f"example {j}'s loss is {alone[j]:.6g} alone, {whole[j]:.6g} in a batch of {n}{what}"


def _eqns(jaxpr):
  """Every equation of jaxpr and of its sub-jaxprs."""
  for eqn in jaxpr.eqns:
    yield eqn
    for v in eqn.params.values():
      for sub in (v if isinstance(v, (tuple, list)) else (v,)):
        if isinstance(sub, jcore.ClosedJaxpr):
          yield from _eqns(sub.jaxpr)
        elif isinstance(sub, jcore.Jaxpr):
          yield from _eqns(sub)


def _least_eps(jaxpr) -> float:
  """The machine epsilon of the least precise float any operation of jaxpr produces."""
  eps = [float(jnp.finfo(v.aval.dtype).eps) for e in _eqns(jaxpr) for v in e.outvars
         if jnp.issubdtype(getattr(v.aval, "dtype", np.int32), jnp.floating)]
  return max(eps, default=0.0)


def _draws(jaxpr) -> bool:
  return any(e.primitive.name in RANDOM for e in _eqns(jaxpr))
