"""The surgery planner: which layer calls get statistics, on which leaves, along which axis.

`make_plan` traces loss_fn abstractly at batch sizes B and B+1 (`nn.intercept_methods`)
and records one `Site` per call of a standard layer that owns parameters, in forward
order: its kind, its parameter leaves, whether the request's layer selection covers it,
the example axis of its input (the one axis whose size follows the batch; None for an
input shared across the batch), the dense contraction axes, the tokens per example. Any
other module that owns parameters, a layer used twice (other than a tied nn.Embed,
`__call__` then `attend`), or a normalization over other axes raises a ValueError
naming it.
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import numpy as np

from pergrad.layer_types import LAYER_TYPES, selects
from pergrad.stats.request import StatsRequest

# Layer type -> handler kind (`pergrad.stats.surgery.HANDLERS`), and each kind's leaves.
KIND = {nn.Dense: "dense", nn.DenseGeneral: "dense", nn.Embed: "embed",
        nn.LayerNorm: "norm", nn.RMSNorm: "norm"}
LEAVES = {"dense": ("kernel", "bias"), "embed": ("embedding",), "norm": ("scale", "bias")}
METHODS = ("__call__", "attend")


def unsupported(msg: str) -> ValueError:
  return ValueError(f"surgery backend: {msg}; use backend='vmap', which supports any model.")


@dataclasses.dataclass(frozen=True)
class Site:
  """One intercepted layer call, in forward order."""

  path: tuple[str, ...]
  kind: str  # the handler kind (`KIND`): "dense" | "embed" | "norm"
  leaves: tuple[str, ...]  # its parameter leaves (of LEAVES[its handler kind])
  selected: bool  # covered by StatsRequest.layers: else it runs untouched
  in_axis: int | None  # example axis of the input; None: shared across the batch
  out_axis: int  # example axis of the (broadcast) output
  contract: tuple[int, ...] = ()  # dense: contracted input axes, in kernel order
  num_rows: int = 0  # embed: table rows V
  attend: bool = False  # embed: the `attend` call (y = x Eᵀ), else a lookup
  tied: bool = False  # embed used by both __call__ and attend
  norm: tuple = ()  # (epsilon, use_mean, use_fast_variance)
  rows: int = 0  # tokens per example R
  out_features: int = 0  # dense: L, the product of the kernel's output axes
  plain_dot: bool = True  # dense: Flax's default lax.dot_general (no injected one)


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sites of one model and batch shape, and the parameter leaves they cover.

  Attributes:
    sites: one per layer call, in forward order.
    B: examples in the batch.
    T: tokens per example (rows seen by every layer; 1 for a model without sites).
    keys: every parameter leaf's path (tuple of names), in tree order.
    treedef: the parameter tree's structure (for `keys`).
  """

  sites: tuple[Site, ...]
  B: int
  T: int
  keys: tuple[tuple[str, ...], ...]
  treedef: object

  def tree(self, flat: dict):
    """The parameter-shaped tree of {leaf path: value}."""
    return jax.tree_util.tree_unflatten(self.treedef, [flat[k] for k in self.keys])


def make_plan(loss_fn, params, batch, request: StatsRequest) -> Plan:
  """The plan of `loss_fn` on a batch shaped like `batch` (module docstring)."""
  B = next(x.shape[0] for x in jax.tree.leaves(batch) if np.ndim(x))
  path_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = tuple(tuple(str(getattr(k, "key", k)) for k in kp) for kp, _ in path_leaves)
  chosen = {k[:-1] for k in keys if selects(request.layers, "/".join(k))}
  sites = _sites(loss_fn, params, batch, B, set(keys), chosen)
  rows = {s.rows for s in sites}
  if request.granularity == "token" and len(rows) > 1:
    raise unsupported(f"per-token statistics need every layer to see the same tokens per "
                      f"example, got {sorted(rows)}")
  if not chosen:
    raise ValueError(f"layers={list(request.layers)} selects no parameter leaf; choose layer "
                     f"types {LAYER_TYPES} or path patterns of the model's leaves.")
  return Plan(sites=tuple(sites), B=B, T=rows.pop() if rows else 1, keys=keys,
              treedef=treedef)


def _trace_calls(loss_fn, params, batch):
  """Shapes of every module method call of loss_fn (abstract evaluation)."""
  log = []

  def rec(next_fun, args, kwargs, ctx):
    out = next_fun(*args, **kwargs)
    if ctx.method_name in METHODS:
      x = args[0] if args else next(iter(kwargs.values()), None)
      log.append(dict(path=tuple(ctx.module.path), type=type(ctx.module),
                      method=ctx.method_name, module=_attrs(ctx.module),
                      x=getattr(x, "shape", None), y=getattr(out, "shape", None)))
    return out

  def run(p, b):
    with nn.intercept_methods(rec):
      return loss_fn(p, b)

  jax.eval_shape(run, params, batch)
  return log


def _attrs(m) -> dict:
  names = ("axis", "batch_dims", "num_embeddings", "epsilon", "use_fast_variance",
           "reduction_axes", "feature_axes", "axis_name", "dot_general", "dot_general_cls")
  return {k: getattr(m, k) for k in names if hasattr(m, k)}


def _struct(x, lead=None):
  shape = tuple(x.shape)
  if lead is not None and shape:
    shape = (lead,) + shape[1:]
  return jax.ShapeDtypeStruct(shape, x.dtype)


def _example_axis(s1, s2, b1, b2):
  diff = [i for i, (u, v) in enumerate(zip(s1, s2, strict=True)) if u != v]
  if not diff:
    return None
  if len(diff) != 1 or (s1[diff[0]], s2[diff[0]]) != (b1, b2):
    raise unsupported(f"cannot find the example axis of a layer input {s1}")
  return diff[0]


def _sites(loss_fn, params, batch, B: int, keys: set, chosen: set) -> list[Site]:
  """Traces loss_fn at batch sizes B and B+1 and plans one Site per layer call of a
  module that owns parameters (`keys`: the leaf paths; `chosen`: the selected layers)."""
  owners = {k[:-1] for k in keys}
  p_abs = jax.tree.map(_struct, params)
  log1 = _trace_calls(loss_fn, p_abs, jax.tree.map(lambda a: _struct(a, B), batch))
  log2 = _trace_calls(loss_fn, p_abs, jax.tree.map(lambda a: _struct(a, B + 1), batch))
  types = {c["path"]: c["type"] for c in log1}
  for owner in sorted(owners):
    t = types.get(owner)
    if t not in KIND:
      name = t.__name__ if t else "a module never called"
      raise unsupported(f"cannot handle {name} at '{'/'.join(owner)}', which owns parameters")
  calls = [(c1, c2) for c1, c2 in zip(log1, log2, strict=True) if c1["path"] in owners]
  by_path: dict[tuple, list[str]] = {}
  for c1, _ in calls:
    by_path.setdefault(c1["path"], []).append(c1["method"])
  for path, methods in by_path.items():
    if len(methods) > 1 and methods != ["__call__", "attend"]:
      raise unsupported(
          f"'{'/'.join(path)}' is used {len(methods)} times ({methods}); shared weights "
          "are handled only for a tied nn.Embed (__call__ then attend)")
  return [_site(c1, c2, B, tied=by_path[c1["path"]] == ["__call__", "attend"],
                leaves=tuple(leaf for leaf in LEAVES[KIND[c1["type"]]]
                             if c1["path"] + (leaf,) in keys),
                selected=c1["path"] in chosen)
          for c1, c2 in calls]


def _site(c1: dict, c2: dict, B: int, **kw) -> Site:
  """The Site of one call, traced at batch sizes B (c1) and B+1 (c2); kw: tied, leaves,
  selected."""
  kind, a = KIND[c1["type"]], c1["module"]
  attend = c1["method"] == "attend"
  lookup = kind == "embed" and not attend
  ax = _example_axis(c1["x"], c2["x"], B, B + 1)
  nx = len(c1["x"])
  kw.update(path=c1["path"], kind=kind, attend=attend, in_axis=ax)
  contract = ()
  if kind == "dense":
    if a.get("batch_dims"):
      raise unsupported(f"nn.DenseGeneral with batch_dims at '{'/'.join(c1['path'])}'")
    axis = a.get("axis", -1)
    contract = tuple(i % nx for i in (axis if isinstance(axis, (tuple, list)) else (axis,)))
    kw["contract"] = contract
    kw["plain_dot"] = a.get("dot_general") is None and a.get("dot_general_cls") is None
    kw["out_features"] = int(np.prod(c1["y"][len(c1["x"]) - len(contract):])) \
        if c1["y"] else 0
  if kind == "embed":
    kw["num_rows"] = a["num_embeddings"]
  if kind == "norm":
    if a["axis_name"] is not None or any(
        tuple(np.atleast_1d(a[k]) % nx) != (nx - 1,) for k in ("reduction_axes", "feature_axes")):
      raise unsupported(f"{c1['type'].__name__} at '{'/'.join(c1['path'])}' normalises "
                        "over axes other than the last one (or over a named axis)")
    kw["norm"] = (a["epsilon"], c1["type"] is nn.LayerNorm, a["use_fast_variance"])
  kw["out_axis"] = 0 if ax is None else ax - sum(i < ax for i in contract)
  feat = set(contract) if kind == "dense" else (set() if lookup else {nx - 1})
  kw["rows"] = int(np.prod([d for i, d in enumerate(c1["x"]) if i != ax and i not in feat]))
  return Site(**kw)
