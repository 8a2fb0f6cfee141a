"""The surgery planner: which layer calls get statistics, on which leaves, along which axis.

`make_plan` traces loss_fn abstractly at batch sizes B and B+1 with every frontend routed
(`frontends.route`) and records one `Site` per standard layer call, in forward order: its
leaves by array identity with those of params as passed (`call_keys`), its example axis the
one input axis whose size follows the batch. A layer used twice (but a tied table), a
normalization over other axes, a dense layer with batch axes, an input whose example axis
cannot be found refuse its leaves, as does anything `proof.prove` cannot show exact; a
refused leaf's calls run untouched and `Plan.refused` names it with the reason; a leaf that
never reaches the loss gets zero statistics. Plans are remembered (`memo`); layer types come
from a norm or embedding call's kind, else from leaf names (`Plan.rules`, `layer_types`).
"""

from __future__ import annotations

import dataclasses
import itertools

import flax.linen as nn
import jax
import numpy as np

from pergrad.layer_types import LAYER_TYPES, TYPE_RULES, call_rules, selects
from pergrad.stats.request import StatsRequest
from pergrad.stats.surgery import frontends, lifted, proof
from pergrad.stats.surgery.memo import memo
from pergrad.stats.surgery.proof import Unsupported, unsupported


@dataclasses.dataclass(frozen=True)
class Site:
  """One layer call, in forward order."""

  path: tuple[str, ...]  # the layer (Linen module path, or its first leaf's parent)
  kind: str  # the handler kind: "dense" | "embed" | "norm"
  leaves: tuple[str, ...]  # its roles that have a parameter (kernel, bias, embedding, scale)
  selected: bool  # covered by StatsRequest.layers: else it runs untouched
  in_axis: int | None  # example axis of the input; None: shared across the batch
  out_axis: int  # example axis of the (broadcast) output
  keys: tuple[tuple[str, ...], ...] = ()  # each role's leaf path in params
  contract: tuple[int, ...] = ()  # dense: contracted input axes, in kernel order
  num_rows: int = 0  # embed: table rows V
  attend: bool = False  # embed: the `attend` call (y = x Eᵀ), else a lookup
  tied: bool = False  # embed used by both a lookup and attend
  norm: tuple = ()  # (epsilon, use_mean, use_fast_variance)
  rows: int = 0  # tokens per example R
  out_features: int = 0  # dense: L, the product of the kernel's output axes
  plain_dot: bool = True  # dense: `LayerCall.forward` is the layer's own forward
  proven: bool = True  # every leaf of the call shown exact (`proof`); else it runs untouched
  lifted: int = -1  # the number of a lifted call (inside scan / remat: `lifted`), else -1
  inside: tuple[str, ...] = ()  # a lifted call: the primitives around it, outermost first


@dataclasses.dataclass(frozen=True)
class Plan:
  """The sites of one model and batch shape, and the parameter leaves they cover.

  Attributes:
    sites: one per layer call, in forward order.
    B: examples in the batch.
    T: tokens per example (rows seen by every layer; 1 for a model without sites).
    keys: every parameter leaf's path (tuple of names), in tree order.
    treedef: the parameter tree's structure (for `keys`).
    rules: layer-type rules: the request's, then norm/embedding leaves' kinds, then `TYPE_RULES`.
    refused: (leaf path, reason) of the leaves surgery cannot show exact (refused for
      their own use first, then for sharing a call with one), each in tree order; their
      calls run untouched and their statistics need another backend.
  """

  sites: tuple[Site, ...]
  B: int
  T: int
  keys: tuple[tuple[str, ...], ...]
  treedef: object
  rules: tuple[tuple[str, str], ...] = TYPE_RULES
  refused: tuple[tuple[str, str], ...] = ()

  def refusal(self) -> Unsupported:
    """The refusal of the first refused leaf (one line naming it and the reason)."""
    path, reason = self.refused[0]
    more = f" (and {len(self.refused) - 1} more leaves)" if len(self.refused) > 1 else ""
    return unsupported(f"'{path}': {reason}{more}")

  def tree(self, flat: dict):
    """The parameter-shaped tree of {leaf path: value}."""
    return jax.tree_util.tree_unflatten(self.treedef, [flat[k] for k in self.keys])


def leaf_keys(params) -> tuple[tuple[tuple[str, ...], ...], tuple[str, ...], object]:
  """(keys, "a/b/c" paths, treedef) of the parameter leaves, in tree order."""
  path_leaves, treedef = jax.tree_util.tree_flatten_with_path(params)
  keys = tuple(tuple(str(getattr(k, "key", k)) for k in kp) for kp, _ in path_leaves)
  paths = tuple(jax.tree_util.keystr(tuple(kp), simple=True, separator="/")
                for kp, _ in path_leaves)
  return keys, paths, treedef


def call_keys(call, ids: dict) -> dict:
  """role -> leaf key of one `LayerCall`, by the identity of its parameter arrays with the
  leaves of params as passed (nested under any keys, a part of the model's variables); {}
  for a call whose parameters are all constants of loss_fn (a frozen part closed over: no
  leaf, no statistics) or one of which is computed inside loss_fn (`copy_note`): the plan
  does not count it, it runs untouched, and the proof refuses the leaves it reaches."""
  given = {r: v for r, v in call.params.items() if v is not None}
  out = {r: ids[id(v)] for r, v in given.items() if id(v) in ids}
  if copy_note(call, ids):
    return {}
  if out and len(out) != len(given):
    where = f" at '{_name(call.path)}'" if call.path else ""
    raise unsupported(f"the {call.name} call{where} mixes leaves of params "
                      f"({'/'.join(out)}) with constants of loss_fn")
  return out


def copy_note(call, ids: dict) -> str:
  """Why a `LayerCall` whose parameter is computed inside loss_fn (a traced value that is
  not a leaf of params) is not counted, in words; "" for any other call."""
  copies = [r for r, v in call.params.items()
            if v is not None and id(v) not in ids and isinstance(v, jax.core.Tracer)]
  if not copies:
    return ""
  where = f" at '{_name(call.path)}'" if call.path else ""
  return (f"the {copies[0]} of the {call.name} call{where} is not a leaf of params but "
          "computed inside loss_fn (a transformed copy, e.g. w.astype(...); a slice of a "
          "reshaped stack in jax.lax.scan; or a second model's parameters made from the "
          "leaves, e.g. a teacher on stop_gradient(params)); pass each parameter array as it is "
          "in params, or close over a frozen part as a constant")


def array_ids(p, keys) -> dict:
  """{id(leaf): key} of the parameter leaves as traced."""
  return {id(v): k for k, v in zip(keys, jax.tree.leaves(p), strict=True)}


def site_router(plan: Plan, p, handler, every: bool = False):
  """The routed handler of one trace: the i-th layer call with parameters is
  plan.sites[i] (the j-th lifted call, the site whose `lifted` is j), sent to
  handler(site, LayerCall) when selected (else it runs untouched; all run untouched when
  handler is None; every: send unselected ones too)."""
  ids = array_ids(p, plan.keys)
  state = {"i": 0, "j": itertools.count()}
  by_serial = {s.lifted: s for s in plan.sites if s.lifted >= 0}

  def route(layer):
    keys = call_keys(layer, ids)
    site = None
    if handler is not None and not keys and lifted.lifts(layer, ids):
      site = by_serial.get(next(state["j"]))
    if handler is None or not (keys or site):
      return layer.run()
    if site is None:
      site = plan.sites[state["i"]]
      state["i"] += 1
    if not site.lifted >= 0 and (site.keys, site.attend) != (tuple(keys.values()),
                                                            layer.attend):
      raise RuntimeError(f"surgery: call order changed at {'/'.join(site.path)}")
    if not site.proven:
      return layer.run()
    return handler(site, layer) if site.selected or every else layer.run()

  return route


@memo
def leaf_rules(loss_fn, params, batch, request: StatsRequest) -> tuple[tuple[str, str], ...]:
  """The layer-type rules of loss_fn's leaves, whatever the backend (`layer_types.call_rules`
  from one abstract trace of its layer calls); the user's rules and the names alone where
  the model cannot be traced with its layer calls routed. ValueError where a non-empty
  `request.layers` selects no leaf."""
  keys, paths, _ = leaf_keys(params)
  try:
    log, _, _ = _trace_calls(loss_fn, params, batch, keys)
  except Exception:  # noqa: BLE001 - names then decide; the backend reports the model's error
    log = []
  by_key = dict(zip(keys, paths, strict=True))
  rules = call_rules({by_key[k]: c["kind"] for c in log for k in c["keys"].values()},
                     request.type_rules)
  if request.layers and not any(selects(request.layers, p, rules) for p in paths):
    raise ValueError(f"layers={list(request.layers)} selects no parameter leaf; choose layer "
                     f"types {LAYER_TYPES} or path patterns of the model's leaves.")
  return rules


@memo
def make_plan(loss_fn, params, batch, request: StatsRequest) -> Plan:
  """The plan of `loss_fn` on a batch shaped like `batch` (module docstring); the proof
  that surgery is exact for it (`proof.prove`, one more abstract trace, at batch B) or its
  `Unsupported` (a model that cannot be traced)."""
  B = next(x.shape[0] for x in jax.tree.leaves(batch) if np.ndim(x))
  keys, paths, treedef = leaf_keys(params)
  try:
    calls, owners, notes, lifts = _traced_sites(loss_fn, params, batch, B, keys)
    by_key = dict(zip(keys, paths, strict=True))
    sites, _ = _sites(calls, B)
    owned = {by_key[k]: w for k, w in owners.items()}
    why_of, lifted_keys, inside = proof.prove(
        loss_fn, jax.tree.map(_struct, params), jax.tree.map(_struct, batch), keys, paths,
        [(c1["y"], c1["dtype"]) for c1, _ in calls],
        [i for i, s in enumerate(sites) if s.in_axis is None and s.proven], call_keys)
    calls = calls + lifted.resolved(lifts, lifted_keys, dict(zip(paths, keys, strict=True)),
                                    inside)
    sites, refused = _sites(calls, B)
    refused = {by_key[k]: why for k, why in refused.items()}
    for s in sites:
      why = lifted.refusal(s, request)
      refused.update({by_key[k]: why for k in s.keys if why and by_key[k] not in refused})
    for path, why in why_of.items():
      if path not in refused:
        refused[path] = _in_words(why, owned.get(path), notes)
  except Unsupported:
    raise
  except Exception as e:  # noqa: BLE001 - the model's own error raises below, as it is
    jax.eval_shape(loss_fn, params, batch)
    raise unsupported(f"tracing loss_fn with its layer calls routed failed "
                      f"({type(e).__name__}: {e})") from e
  rules = call_rules({by_key[k]: c1["kind"] for c1, _ in calls for k in c1["keys"].values()},
                     request.type_rules)
  chosen = {k for k, p in zip(keys, paths, strict=True) if selects(request.layers, p, rules)}
  sites, refused = _close(sites, refused, by_key)
  sites = [dataclasses.replace(s, selected=any(k in chosen for k in s.keys)) for s in sites]
  rows = {s.rows for s in sites if s.proven}
  if request.granularity == "token" and len(rows) > 1:
    raise unsupported(f"per-token statistics need every layer to see the same tokens per "
                      f"example, got {sorted(rows)}")
  if not chosen:
    raise ValueError(f"layers={list(request.layers)} selects no parameter leaf; choose layer "
                     f"types {LAYER_TYPES} or path patterns of the model's leaves.")
  return Plan(sites=tuple(sites), B=B, T=rows.pop() if rows else 1, keys=keys,
              treedef=treedef, rules=rules,
              refused=tuple(sorted(((p, refused[p]) for p in paths if p in refused),
                                   key=lambda pr: pr[1].startswith("it shares"))))


def _in_words(why: str, owner: str | None, notes: list) -> str:
  """The proof's reason for refusing a leaf, with the module other than a standard layer
  that owns it and, for a use outside layer calls, a layer call's parameter computed
  inside loss_fn (`copy_note`) where there is one."""
  if notes and why.startswith("it reaches the loss outside"):
    why = f"{why}; {notes[0]}"
  return f"cannot handle {owner}, which owns parameters: {why}" if owner else why


def _close(sites, refused: dict, by_key: dict):
  """(sites with `proven` False where a leaf is refused, refusals with every leaf of such
  a call): a call runs tapped or untouched as a whole, and a leaf two calls share (a tied
  table) is refused with either."""
  refused = dict(refused)
  changed = True
  while changed:
    changed = False
    for s in sites:
      paths = [by_key[k] for k in s.keys]
      bad = next((p for p in paths if p in refused), None)
      for p in paths:
        if bad is not None and p not in refused:
          refused[p] = f"it shares a layer call with the refused '{bad}'"
          changed = True
  sites = [dataclasses.replace(s, proven=not any(by_key[k] in refused for k in s.keys))
           for s in sites]
  return sites, refused


def _trace_calls(loss_fn, params, batch, keys):
  """(every layer call's record, {leaf key: its owner, "<class> at '<path>'"}, the calls'
  `copy_note`s) of loss_fn, traced abstractly; owners are the Linen modules, other than
  standard layers, that hold a leaf of params as their own parameter (for messages)."""
  log, owners, ids, notes = [], {}, {}, []

  def linen_log(next_fun, args, kwargs, ctx):
    module = ctx.module
    if type(module) not in frontends.LINEN_KIND and module.scope is not None:
      for v in module.variables.get("params", {}).values():
        if id(v) in ids:
          owners.setdefault(ids[id(v)], f"{type(module).__name__} at '{_name(module.path)}'")
    return next_fun(*args, **kwargs)

  def run(p, b):
    ids.update(array_ids(p, keys))
    serials = itertools.count()

    def rec(call):
      out = call.run()
      lift = next(serials) if lifted.lifts(call, ids) else -1
      note = copy_note(call, ids)
      if note and note not in notes:
        notes.append(note)
      log.append(dict(keys=call_keys(call, ids), lifted=lift, kind=call.kind, attend=call.attend,
                      attrs=call.attrs, name=call.name, x=tuple(call.x.shape),
                      y=tuple(getattr(out, "shape", ())), dtype=getattr(out, "dtype", None)))
      return out

    with nn.intercept_methods(linen_log), frontends.route(rec):
      return loss_fn(p, b)

  jax.eval_shape(run, params, batch)
  return log, owners, notes


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


def _name(key) -> str:
  return "/".join(key)


def _traced_sites(loss_fn, params, batch, B: int, keys):
  """([(call at B, call at B+1)] of the layer calls that own parameters, their owners,
  `copy_note`s)."""
  p_abs = jax.tree.map(_struct, params)
  log1, owners, notes = _trace_calls(loss_fn, p_abs,
                                     jax.tree.map(lambda a: _struct(a, B), batch), keys)
  log2, _, _ = _trace_calls(loss_fn, p_abs, jax.tree.map(lambda a: _struct(a, B + 1), batch),
                         keys)
  pairs = list(zip(log1, log2, strict=True))
  return ([(c1, c2) for c1, c2 in pairs if c1["keys"]], owners, notes,
          [(c1, c2) for c1, c2 in pairs if c1["lifted"] >= 0])


def _sites(calls, B: int) -> tuple[list[Site], dict]:
  """(one Site per layer call, none selected yet; {leaf key: reason} of the leaves refused
  here). A leaf no call uses is left to the proof (refused where it reaches the loss
  otherwise; never reached: zero statistics)."""
  used: dict[tuple, list] = {}
  refused: dict[tuple, str] = {}
  for c1, _ in calls:
    for k in c1["keys"].values():
      used.setdefault(k, []).append(c1)
  for k, cs in used.items():
    methods = ["attend" if c["attend"] else "__call__" for c in cs]
    if len(cs) > 1 and (methods != ["__call__", "attend"] or cs[0]["kind"] != "embed"
                        or any(c["lifted"] >= 0 for c in cs)):
      refused[k] = (
          f"'{_name(k[:-1])}' is used {len(cs)} times ({methods}): one {cs[0]['name']} layer "
          "called more than once on the same parameter arrays (shared weights); surgery "
          "handles shared weights only for a tied embedding table (lookup then attend)")
  sites = []
  for c1, c2 in calls:
    try:
      sites.append(_site(c1, c2, B, tied=len(used[next(iter(c1["keys"].values()))]) > 1))
    except Unsupported as e:
      refused.update((k, e.reason) for k in c1["keys"].values() if k not in refused)
      sites.append(Site(path=next(iter(c1["keys"].values()))[:-1], kind=c1["kind"],
                        leaves=tuple(c1["keys"]), keys=tuple(c1["keys"].values()),
                        selected=False, in_axis=None, out_axis=0, attend=c1["attend"],
                        proven=False, lifted=c1["lifted"]))
  return sites, refused


def _site(c1: dict, c2: dict, B: int, tied: bool) -> Site:
  """The Site of one call, traced at batch sizes B (c1) and B+1 (c2)."""
  kind, a, attend = c1["kind"], c1["attrs"], c1["attend"]
  roles = tuple(c1["keys"])
  first = c1["keys"][roles[0]]
  if a.get("unsupported"):
    raise unsupported(f"{a['unsupported']} at '{_name(first[:-1])}'")
  ax = _example_axis(c1["x"], c2["x"], B, B + 1)
  nx = len(c1["x"])
  kw = dict(path=first[:-1], kind=kind, attend=attend, in_axis=ax, tied=tied, leaves=roles,
            keys=tuple(c1["keys"][r] for r in roles), selected=False, lifted=c1["lifted"],
            inside=c1.get("inside", ()))
  contract = ()
  if kind == "dense":
    contract = kw["contract"] = a["contract"]
    kw["plain_dot"] = a["plain_dot"]
    kw["out_features"] = int(np.prod(c1["y"][nx - len(contract):])) if c1["y"] else 0
  if kind == "embed":
    kw["num_rows"] = a["num_embeddings"]
  if kind == "norm":
    kw["norm"] = a["norm"]
  kw["out_axis"] = 0 if ax is None else ax - sum(i < ax for i in contract)
  lookup = kind == "embed" and not attend
  feat = set(contract) if kind == "dense" else (set() if lookup else {nx - 1})
  kw["rows"] = int(np.prod([d for i, d in enumerate(c1["x"]) if i != ax and i not in feat]))
  return Site(**kw)
