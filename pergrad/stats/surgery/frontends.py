"""Frontends: Flax Linen and Flax NNX layers report to the surgery backend as taps do.

`route(handler)` makes every standard layer call inside it a `taps.LayerCall` given to
`handler`, whatever the model is written in:
  - Linen: `nn.intercept_methods` on nn.Dense, nn.DenseGeneral, nn.Embed (`__call__`,
    `attend`), nn.LayerNorm, nn.RMSNorm; the layer's path is its module path;
  - NNX: nnx.Linear, nnx.LinearGeneral, nnx.Einsum (when it is a dense layer:
    `einsum_contract`), nnx.Embed (`__call__`, `attend`), nnx.LayerNorm,
    nnx.RMSNorm have their methods swapped for reporting ones while `route` is active
    and restored on exit (also on error); the layer's path comes from its parameter
    arrays (they are leaves of the params passed to `compute`: `nnx.split` then
    `nnx.merge` inside loss_fn);
  - plain JAX: `pergrad.stats.taps` (dense, embed, attend, layer_norm, rms_norm).
The kind (dense, embed, norm) comes from the class or function, never from a name.
"""

from __future__ import annotations

import contextlib
import inspect

import flax.linen as nn
import jax
import numpy as np
from flax import nnx

from pergrad.stats import taps
from pergrad.stats.taps import LayerCall

LINEN_KIND = {nn.Dense: "dense", nn.DenseGeneral: "dense", nn.Embed: "embed",
              nn.LayerNorm: "norm", nn.RMSNorm: "norm"}
NNX_KIND = {nnx.Linear: "dense", nnx.LinearGeneral: "dense", nnx.Einsum: "dense",
            nnx.Embed: "embed", nnx.LayerNorm: "norm", nnx.RMSNorm: "norm"}
METHODS = ("__call__", "attend")
ROLES = {"dense": ("kernel", "bias"), "embed": ("embedding",), "norm": ("scale", "bias")}


def _last_axis_only(x_ndim, reduction_axes, feature_axes, axis_name=None) -> str | None:
  """None if a norm normalises over the last axis only, else the reason."""
  if axis_name is not None or any(tuple(np.atleast_1d(a) % x_ndim) != (x_ndim - 1,)
                                  for a in (reduction_axes, feature_axes)):
    return "normalises over axes other than the last one (or over a named axis)"
  return None


# --- Linen ------------------------------------------------------------------------------------
def linen_dense_forward(module, x, params, contract):
  """What nn.Dense / nn.DenseGeneral (no batch_dims, default dot_general) compute."""
  x, kernel, bias = module.promote_dtype(x, params["kernel"], params.get("bias"),
                                         dtype=module.dtype)
  return taps.dense_forward(x, {"kernel": kernel, "bias": bias}, contract, module.precision)


def linen_call(module, method: str, args, kwargs, run) -> LayerCall:
  """The `LayerCall` of one intercepted Linen layer call."""
  kind = LINEN_KIND[type(module)]
  x = args[0] if args else kwargs[_input_name(getattr(type(module), method))]
  own = module.variables.get("params", {})
  params = {r: own.get(r) for r in ROLES[kind]}
  attrs, forward = {}, None
  nx = x.ndim
  if kind == "dense":
    axis = getattr(module, "axis", -1)
    contract = tuple(i % nx for i in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    attrs = dict(contract=contract, plain_dot=getattr(module, "dot_general", None) is None
                 and getattr(module, "dot_general_cls", None) is None)
    if getattr(module, "batch_dims", ()):
      attrs["unsupported"] = "nn.DenseGeneral with batch_dims"
    forward = lambda x_, p_: linen_dense_forward(module, x_, p_, contract)
  elif kind == "embed":
    attrs = dict(num_embeddings=module.num_embeddings)
  else:
    attrs = dict(norm=(module.epsilon, type(module) is nn.LayerNorm, module.use_fast_variance),
                 dtype=module.dtype)
    why = _last_axis_only(nx, module.reduction_axes, module.feature_axes, module.axis_name)
    if why:
      attrs["unsupported"] = f"{type(module).__name__} {why}"
  return LayerCall(kind, x, params, run=run, attrs=attrs, forward=forward,
                   attend=method == "attend", path=tuple(module.path),
                   name=type(module).__name__, module=module)


def linen_interceptor(handler):
  def interceptor(next_fun, args, kwargs, ctx):
    if ctx.method_name not in METHODS or type(ctx.module) not in LINEN_KIND:
      return next_fun(*args, **kwargs)
    return handler(linen_call(ctx.module, ctx.method_name, args, kwargs,
                              lambda: next_fun(*args, **kwargs)))
  return interceptor


# --- NNX --------------------------------------------------------------------------------------
def _value(v):
  return None if v is None else v[...]


def nnx_dense_forward(module, x, params, contract):
  """What nnx.Linear / nnx.LinearGeneral (no batch axes, default dot_general) compute."""
  x, kernel, bias = module.promote_dtype((x, params["kernel"], params.get("bias")),
                                         dtype=module.dtype)
  return taps.dense_forward(x, {"kernel": kernel, "bias": bias}, contract, module.precision)


def einsum_contract(eq: str, x_ndim: int, kernel_shape, bias_shape) -> tuple:
  """(contract, None) for an nnx.Einsum equation that is a dense layer, else ((), reason).

  It is one when the kernel's axes are the contracted input axes then the output
  features, and the output is the input's other axes (in order) then those features:
  "btd,dnh->btnh", "...nh,nhd->...d" (x's contracted axes in kernel order, as
  nn.DenseGeneral's); the bias, if any, spans the features."""
  eq = eq.replace(" ", "")
  lhs, out = eq.split("->") if "->" in eq else (eq, None)
  xs, ks = lhs.split(",")
  free = [c for c in map(chr, range(0x100, 0x200)) if c not in eq]
  ell = "".join(free[:x_ndim - len(xs.replace("...", ""))])
  xs, out = xs.replace("...", ell), (out or "").replace("...", ell)
  con = [c for c in ks if c in xs and c not in out]
  feat = [c for c in ks if c not in con]
  ok = (out and len(set(xs)) == len(xs) and len(set(ks)) == len(ks)
        and list(ks) == con + feat and not set(feat) & set(xs)
        and list(out) == [c for c in xs if c not in con] + feat
        and bias_shape in (None, tuple(kernel_shape[len(con):])))
  if not ok:
    return (), f"nnx.Einsum '{eq}' is not a dense layer (see frontends.einsum_contract)"
  return tuple(xs.index(c) for c in con), None


def nnx_call(module, method: str, x, kwargs, run) -> LayerCall:
  """The `LayerCall` of one NNX layer call."""
  kind = next(k for c, k in NNX_KIND.items() if isinstance(module, c))
  params = {r: _value(getattr(module, r, None)) for r in ROLES[kind]}
  attrs, forward, nx = {}, None, x.ndim
  extra = {k: v for k, v in kwargs.items() if v is not None}
  if kind == "dense" and isinstance(module, nnx.Einsum):
    contract, why = einsum_contract(kwargs.get("einsum_str") or module.einsum_str, nx,
                                    params["kernel"].shape,
                                    None if params["bias"] is None else params["bias"].shape)
    attrs = dict(contract=contract, plain_dot=False)  # its own einsum, not dense_forward
    if why:
      attrs["unsupported"] = why
  elif kind == "dense":
    if isinstance(module, nnx.LinearGeneral):
      contract = tuple(int(a) % nx for a in np.atleast_1d(module.axis))
      custom = module.dot_general is not None or module.dot_general_cls is not None
      if module.batch_axis:
        attrs["unsupported"] = "nnx.LinearGeneral with batch_axis"
    else:
      contract = (nx - 1,)
      custom = module.dot_general is not jax.lax.dot_general
    attrs.update(contract=contract, plain_dot=not (custom or extra
                                                   or module.preferred_element_type))
    forward = lambda x_, p_: nnx_dense_forward(module, x_, p_, contract)
  elif kind == "embed":
    attrs = dict(num_embeddings=module.num_embeddings)
  else:
    layer = isinstance(module, nnx.LayerNorm)
    attrs = dict(norm=(module.epsilon, layer, module.use_fast_variance), dtype=module.dtype)
    why = _last_axis_only(nx, module.reduction_axes, module.feature_axes, module.axis_name)
    if why or extra:
      attrs["unsupported"] = f"{type(module).__name__} {why or 'with a mask'}"
  return LayerCall(kind, x, params, run=run, attrs=attrs, forward=forward,
                   attend=method == "attend", name=type(module).__name__)


def _input_name(fn) -> str:
  """The name of a layer method's input argument (the one after self: inputs, x, query)."""
  return list(inspect.signature(fn).parameters)[1]


def _reporting(method: str, original):
  """`original` (an NNX layer method) reporting its calls; the input positional or by
  keyword (lin(inputs=x)). A call with more positional arguments runs as it is (its
  parameters then reach the loss outside a layer call: `proof` refuses the model)."""
  input_name = _input_name(original)

  def wrapped(self, *args, **kwargs):
    run = lambda: original(self, *args, **kwargs)
    if not taps.active() or len(args) > 1 or (not args and input_name not in kwargs):
      return run()
    rest = dict(kwargs)
    x = args[0] if args else rest.pop(input_name)
    return taps.report(nnx_call(self, method, x, rest, run))
  wrapped.__wrapped__ = original
  return wrapped


@contextlib.contextmanager
def nnx_reporting():
  """NNX's standard layers report to the routed handler inside; restored on exit."""
  swapped = []
  try:
    for cls in NNX_KIND:
      for method in METHODS:
        original = cls.__dict__.get(method)
        if original is None or hasattr(original, "__wrapped__"):
          continue  # inherited, or already swapped by an enclosing `route`
        setattr(cls, method, _reporting(method, original))
        swapped.append((cls, method, original))
    yield
  finally:
    for cls, method, original in reversed(swapped):
      setattr(cls, method, original)


@contextlib.contextmanager
def route(handler):
  """Every standard layer call inside (Linen, NNX, `taps`) goes to handler(LayerCall)."""
  with taps.routed(handler), nnx_reporting(), nn.intercept_methods(linen_interceptor(handler)):
    yield
