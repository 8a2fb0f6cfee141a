"""Taps: where a standard layer call reports to the surgery backend, for any JAX model.

A function-style model (plain JAX, Equinox-style, Haiku-free code) calls these in place
of its own matmul, lookup or normalization:

    from pergrad.stats import taps
    h = taps.layer_norm(x, p["ln"]["scale"], p["ln"]["bias"])
    h = taps.dense(h, p["mlp"]["kernel"], p["mlp"]["bias"])      # y = x W + b
    e = taps.embed(ids, p["wte"]); logits = taps.attend(h, p["wte"])   # tied table

Outside the surgery backend each is the plain computation (nothing recorded, no cost).
Inside it (`routed`), each call becomes a `LayerCall` handed to the backend, which knows
the layer's kind from the function called (dense, embed, norm) and its parameters'
paths from the parameter arrays themselves: pass the leaves of `params` as they are
(a transformed copy, e.g. `w.astype(...)`, is not a leaf and is refused by name).
Flax Linen and NNX layers report the same `LayerCall`s (`pergrad.stats.surgery.frontends`).

    dense:      y = Σ_contract x·W + b (the last `axes` axes of x against W's first)
    embed:      y = E[ids]               attend: y = x Eᵀ
    layer_norm: y = (x − μ)/√(σ² + ε)·γ + β over the last axis   rms_norm: μ = 0, no β
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import itertools
from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax._src import config as jax_config

KINDS = ("dense", "embed", "norm")
_ROUTE: contextvars.ContextVar = contextvars.ContextVar("pergrad_taps_route", default=None)
# A number per `routed` entry in JAX's trace context (thread-local): JAX's caches of traced
# bodies (lax.scan, jax.checkpoint, jit) then never give one routed trace another's layers.
_ROUTE_NUMBER = jax_config.int_state(
    "pergrad_taps_route", 0, "pergrad: the surgery routing in force (0: none)",
    include_in_trace_context=True)
_NUMBERS = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class LayerCall:
  """One call of a standard layer, as a frontend reports it.

  Attributes:
    kind: "dense" | "embed" | "norm" (from the layer's class or tap function).
    x: the layer input (ids for a lookup).
    params: role -> the parameter array the call uses, or None where the layer has none
      (roles: kernel, bias | embedding | scale, bias).
    run: the layer's own forward, () -> y.
    attrs: static settings: dense "contract" (input axes, kernel order), "plain_dot"
      (forward(x, params) is exactly the layer's own); embed "num_embeddings"; norm
      "norm" = (ε, use_mean, use_fast_variance), "dtype"; "unsupported": a reason.
    forward: (x, params) -> y, the pure forward of a dense layer (custom VJPs), or None.
    attend: embed only: y = x Eᵀ (else a lookup).
    path: the layer's path in params when the frontend knows it (Linen); None: found
      from the identity of the parameter arrays.
    name: the layer's class or function, for messages.
    module: the Linen module (Linen only), for messages.
  """

  kind: str
  x: jax.Array
  params: dict
  run: Callable[[], jax.Array]
  attrs: dict
  forward: Callable | None = None
  attend: bool = False
  path: tuple[str, ...] | None = None
  name: str = ""
  module: object = None


@contextlib.contextmanager
def routed(handler: Callable[[LayerCall], jax.Array]):
  """While active, every tap call returns handler(LayerCall) (the surgery backend)."""
  token = _ROUTE.set(handler)
  try:
    with _ROUTE_NUMBER(next(_NUMBERS)):
      yield
  finally:
    _ROUTE.reset(token)


def active() -> bool:
  """Whether a handler is routed (inside the surgery backend)."""
  return _ROUTE.get() is not None


def report(call: LayerCall) -> jax.Array:
  """handler(call) inside `routed`, else call.run()."""
  handler = _ROUTE.get()
  return call.run() if handler is None else handler(call)


# --- the plain-JAX layers -------------------------------------------------------------------
def dense_forward(x, params, contract, precision=None):
  """Σ over x's axes `contract` of x·W (W's leading axes in that order), plus b."""
  kernel, bias = params["kernel"], params.get("bias")
  n = len(contract)
  y = jax.lax.dot_general(x, kernel, ((contract, tuple(range(n))), ((), ())),
                          precision=precision)
  if bias is not None:
    y = y + jnp.reshape(bias, (1,) * (y.ndim - bias.ndim) + bias.shape)
  return y


def dense(x, kernel, bias=None, *, axes: int = 1, precision=None):
  """y = x W + b, contracting x's last `axes` axes with W's first (W: in... × out...)."""
  contract = tuple(range(x.ndim - axes, x.ndim))
  fwd = functools.partial(dense_forward, contract=contract, precision=precision)
  params = {"kernel": kernel, "bias": bias}
  return report(LayerCall("dense", x, params, run=lambda: fwd(x, params), forward=fwd,
                          attrs=dict(contract=contract, plain_dot=True), name="taps.dense"))


def embed(ids, table):
  """y = table[ids] (rows of the V×D table)."""
  return report(LayerCall("embed", ids, {"embedding": table},
                          run=lambda: jnp.take(table, ids, axis=0),
                          attrs=dict(num_embeddings=table.shape[0]), name="taps.embed"))


def attend(x, table):
  """y = x tableᵀ (logits against every row: a tied output layer)."""
  return report(LayerCall("embed", x, {"embedding": table}, run=lambda: jnp.dot(x, table.T),
                          attrs=dict(num_embeddings=table.shape[0]), attend=True,
                          name="taps.attend"))


def _norm(x, scale, bias, eps, use_mean):
  x32 = x.astype(jnp.promote_types(x.dtype, jnp.float32))
  mu = x32.mean(-1, keepdims=True) if use_mean else 0.0
  var = jnp.square(x32 - mu).mean(-1, keepdims=True)
  y = (x32 - mu) * jax.lax.rsqrt(var + eps)
  y = y * scale if scale is not None else y
  y = y + bias if bias is not None else y
  return y.astype(x.dtype)


def layer_norm(x, scale=None, bias=None, *, eps: float = 1e-6):
  """LayerNorm over the last axis: (x − μ)/√(σ² + ε)·γ + β (float32 statistics)."""
  return report(LayerCall("norm", x, {"scale": scale, "bias": bias},
                          run=lambda: _norm(x, scale, bias, eps, True),
                          attrs=dict(norm=(eps, True, False), dtype=x.dtype),
                          name="taps.layer_norm"))


def rms_norm(x, scale=None, *, eps: float = 1e-6):
  """RMSNorm over the last axis: x/√(mean x² + ε)·γ (float32 statistics)."""
  return report(LayerCall("norm", x, {"scale": scale, "bias": None},
                          run=lambda: _norm(x, scale, None, eps, False),
                          attrs=dict(norm=(eps, False, False), dtype=x.dtype),
                          name="taps.rms_norm"))
