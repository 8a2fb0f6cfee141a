"""Surgery handler for embedding tables (nn.Embed, nnx.Embed, `taps.embed`/`taps.attend`:
lookups and `attend`).

A lookup adds its output cotangent row δ_bt to table row id_bt: per example a sort-based
segment-sum combines repeated ids before φ; per token the rows are scattered. `attend`
(y = x Eᵀ) is an outer-product layer with the roles of input and cotangent swapped.

Tied table (one Embed used by `__call__` and then `attend`): a sample is the sum of both
uses before φ, so the two calls exchange values through zero-valued "carriers" that the
lookup's tap emits and the attend's tap receives as cotangents (`Env.carriers`):
  - per example, the attend's tap sends (Δ_out, x) to the lookup's, which forms
    G_b = Δ_out,bᵀ x_b + scatter(ids_b, δin_b) (`sm.tied_example_stats`);
  - per token, the attend's tap computes the outer-product statistics and sends back the
    own-row term u_bt = Δ_out,bt[id_bt] x_bt, with which the lookup corrects row id_bt.
A position embedding called on arange(T) (no example axis) has sample δ_bt at row t.
"""

from __future__ import annotations

from pergrad.stats.surgery import formulas as sm
from pergrad.stats.surgery.probes import Call, Env, lead, rows, tapped, zero_ct


def handle(env: Env, call: Call):
  """y of one lookup or attend call, with its statistics (module docstring)."""
  if call.site.attend:
    return _attend(env, call)
  return _lookup(env, call)


def _lookup(env: Env, call: Call):
  site, B, want = call.site, env.B, env.want

  def body(res, dy, dcarriers, put):
    ids = lead(res["x"], site.in_axis, B).reshape(B, -1)
    d = rows(dy, site.out_axis, B) * env.scale
    flat = env.flat
    if env.token and site.tied:
      u = dcarriers[0].reshape(d.shape)
      st = sm.tied_token_lookup_stats(ids.reshape(-1), flat(d), flat(u), site.num_rows, want)
    elif env.token:
      st = sm.lookup_token_stats(ids.reshape(-1), flat(d), site.num_rows, want)
    elif site.tied:
      st = sm.tied_example_stats(ids, d, dcarriers[0], dcarriers[1], want,
                                 unroll=env.options.scan_unroll)
    else:
      st = sm.lookup_example_stats(ids, d, site.num_rows, want)
    put(st, "embedding")

  if not site.tied:
    return tapped(env, call, body)[0]
  attend = next(s for s in env.sites if s.path == site.path and s.attend)
  D = call.layer.params["embedding"].shape[-1]
  carrier_shapes = ((B, attend.rows, D),) if env.token else (
      (B, attend.rows, site.num_rows), (B, attend.rows, D))
  y, carrier = tapped(env, call, body, carrier_shapes=carrier_shapes)
  ids = lead(call.x, site.in_axis, B).reshape(B, -1)
  env.carriers[site.path] = (carrier[0], ids) if env.token else carrier
  return y


def _attend(env: Env, call: Call):
  site, B, scale, flat = call.site, env.B, env.scale, env.flat

  def body(res, dy, dcarriers, put):
    x = rows(res["x"], site.in_axis, B)
    d = rows(dy, site.out_axis, B)
    if site.tied and not env.token:  # the lookup's tap does the work, after summing both uses
      return {"carrier": (d * scale, x)}
    put(env.outer(d, x), "embedding")
    if site.tied:
      carrier, ids = res["carrier"]
      u = sm.tied_token_own_row(ids.reshape(-1), flat(d * scale), flat(x))
      return {"carrier": (u.reshape(carrier.shape), zero_ct(ids))}
    return None

  if not site.tied:
    return tapped(env, call, body)[0]
  probes = call.probes if env.token else {}
  return tapped(env, call, body, res={"carrier": env.carriers[site.path]}, probes=probes)[0]
