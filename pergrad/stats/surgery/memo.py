"""Plans remembered: the traces of `sites.make_plan` (and of the checks that trace the model
the same way) run once per loss_fn, shapes and request, not once per backend or step."""

from __future__ import annotations

import collections
import functools

import jax

from pergrad.stats.surgery.proof import Unsupported

# (what, loss_fn, params' and batch's shapes, request) -> a plan, rules, separability or
# refusal: the traces run once per model and shape, not once per backend or `compute` call.
_MEMO: collections.OrderedDict = collections.OrderedDict()
MEMO_SIZE = 32


def memo(fn):
  """fn(loss_fn, params, batch, *rest), remembered (its result or its `Unsupported`) by
  `loss_fn` (the object), the shapes and dtypes of params and batch, and rest (the request):
  a step traced again, or `compute`'s auto check then the backend, trace the model once."""
  @functools.wraps(fn)
  def memoized(loss_fn, params, batch, *rest):
    shapes = lambda t: (jax.tree.structure(t), tuple(
        (tuple(getattr(x, "shape", ())), str(getattr(x, "dtype", type(x))))
        for x in jax.tree.leaves(t)))
    try:
      key = (fn.__module__, fn.__name__, loss_fn, shapes(params), shapes(batch), *rest)
      hash(key)
    except TypeError:  # an unhashable loss_fn or tree: no memo
      return fn(loss_fn, params, batch, *rest)
    if key not in _MEMO:
      try:
        _MEMO[key] = fn(loss_fn, params, batch, *rest)
      except Unsupported as e:
        _MEMO[key] = e
      while len(_MEMO) > MEMO_SIZE:
        _MEMO.popitem(last=False)
    _MEMO.move_to_end(key)
    if isinstance(_MEMO[key], Unsupported):
      raise _MEMO[key]
    return _MEMO[key]
  return memoized
