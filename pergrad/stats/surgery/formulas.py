"""Statistics of per-example / per-token gradients from layer inputs and cotangents.

Pure functions used by the backward pass of `pergrad.stats.surgery`. Every input is
already laid out with the example axis first and the token ("row") axes flattened,
cast to float32 and scaled so that each sample is a gradient sample (the surgery
module multiplies the cotangents by B for per-example samples and by B*T for
per-token samples). `want` names registered statistics (`pergrad.stats.registry`);
each function returns a dict with the requested entries: Σ_n φ(g_n) per coordinate
for a statistic of kind "coordinate" (e.g. "sq": Σ_n g_n², "sign": Σ_n sign(g_n)),
Σ_coords φ(g_b) per example (float32[B]) for one of kind "example" (e.g. "norms":
‖g_b‖²), where n runs over the samples: examples b, or tokens (b, t).

Notation: an outer-product layer (Dense, DenseGeneral, Embed.attend) contributes
g = Σ_r l_r r_rᵀ over its rows r, with l = layer input and r = output cotangent (or
the reverse for `attend`). For a multiplicative φ (square, sign, abs, ...),
φ(l rᵀ) = φ(l) φ(r)ᵀ, hence the per-token sums Σ_n φ(l_n r_nᵀ) = φ(L)ᵀ φ(R): one extra
matmul per statistic. Per-example statistics work for any φ with φ(0) = 0; "norms"
may use the Gram ("ghost norm") form, specific to squares.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from pergrad.stats import registry


def zero_after(x):
  """A float32 zero computed from x: a data dependence that keeps XLA from scheduling
  what uses it before x exists (its value is 0 whatever x holds, NaN and inf included).

  XLA:CPU's scheduler (unmoved by `lax.optimization_barrier`, tried) otherwise
  computes anything that reads only forward values (φ of an activation, a zero
  accumulator) early in the backward pass, while every activation is still live, raising
  the step's peak memory; the peak with it is results/cpu/overhead's `peak_ratio`.
  The addition `x + zero_after(y)` fuses into x's consumer: no copy of x. With y
  sharded over devices, reading its first element may cost one scalar collective.
  """
  return jnp.isfinite(x.reshape(-1)[0]).astype(jnp.float32) * 0.0


def zeros_after(x, shape):
  """zeros(shape, float32) that XLA cannot allocate and fill before x exists."""
  return jnp.full(shape, zero_after(x), jnp.float32)


def coordinate_names(want):
  """The coordinate statistics in `want`, in registration order (e.g. ["sq", "sign"])."""
  return list(registry.select(want, "coordinate"))


def example_names(want):
  """The example statistics in `want`, in registration order (e.g. ["norms"])."""
  return list(registry.select(want, "example"))


def _phi(name):
  return registry.get(name).phi


def _needs_materialised(want, ghost_ok: bool) -> bool:
  """Whether per-example gradients must be formed: a coordinate statistic, an example
  statistic other than "norms", or "norms" where the ghost norm is not an option."""
  ex = example_names(want)
  return (bool(coordinate_names(want)) or any(k != "norms" for k in ex)
          or ("norms" in ex and not ghost_ok))


def _phi_of_scalar(name, scale: float) -> float:
  """φ(s) for a positive Python scalar s (with φ multiplicative, φ(s·x) = φ(s)·φ(x))."""
  with jax.ensure_compile_time_eval():
    return float(_phi(name)(jnp.asarray(scale, jnp.float32)))


# --- outer-product layers (kernels) -------------------------------------------
def _row_chunks(B: int, R: int, width: int, max_elems: int) -> int:
  """Smallest number of chunks C | R with B·(R/C)·width ≤ max_elems (1 if it fits)."""
  for c in range(1, R + 1):
    if R % c == 0 and B * (R // c) * width <= max_elems:
      return c
  return R


def outer_token_stats(left_BxRxP, right_BxRxQ, want, scale: float = 1.0,
                      max_elems: int = 1 << 20, unroll: int | bool = 1):
  """Σ_{b,r} φ(s·l_br r_brᵀ) = φ(s)·φ(L)ᵀ φ(R)  (P×Q), one matmul per φ (multiplicative).

  φ(L), φ(R) are formed over chunks of the token axis (lax.scan, `unroll` as in
  `jax.lax.scan`: True makes XLA's cost analysis, which counts a loop body once, count
  every chunk), one φ after the other, so that at most ~max_elems of them live at once:
  no per-token tensor beyond an activation slice.
  """
  phis = coordinate_names(want)
  if not phis:
    return {}
  B, R, P = left_BxRxP.shape
  Q = right_BxRxQ.shape[-1]
  C = _row_chunks(B, R, P + Q, max_elems)

  def chunk_stats(l_BxRcxP, r_BxRcxQ):
    out, prev = {}, None
    for k in phis:  # each φ waits for the previous one's matmul (see zero_after), so
      if out:       # one pair φ(L), φ(R) lives at a time
        z = zero_after(out[prev])
        l_BxRcxP, r_BxRcxQ = l_BxRcxP + z, r_BxRcxQ + z
      phi = _phi(k)
      out[k] = jnp.einsum("brp,brq->pq", phi(l_BxRcxP), phi(r_BxRcxQ))
      prev = k
    return out

  if C == 1:
    out = chunk_stats(left_BxRxP, right_BxRxQ)
  else:
    rc = R // C

    def step(acc, i):
      sl = lambda a: jax.lax.dynamic_slice_in_dim(a, i * rc, rc, axis=1)
      st = chunk_stats(sl(left_BxRxP), sl(right_BxRxQ))
      return {k: acc[k] + st[k] for k in phis}, None

    acc0 = {k: zeros_after(right_BxRxQ, (P, Q)) for k in phis}
    out, _ = jax.lax.scan(step, acc0, jnp.arange(C), unroll=unroll)
  for k in phis:
    if k == "sq":
      out[k] = out[k] * (scale * scale)
    elif (f := _phi_of_scalar(k, scale)) != 1.0:
      out[k] = out[k] * f
  return out


def ghost_norm_is_cheaper(R: int, P: int, Q: int, slack: float = 1.25) -> bool:
  """⟨L Lᵀ, R Rᵀ⟩ (2R²(P+Q) + R² FLOPs, two R×R Grams per example) vs materialising
  Lᵀ R (2RPQ + PQ FLOPs, P×Q per example): fewer FLOPs, or at most `slack`× the FLOPs
  and a smaller temporary (an output layer with a large vocabulary, say)."""
  ghost, dense = 2 * R * R * (P + Q) + R * R, 2 * R * P * Q + P * Q
  return ghost < dense or (ghost <= slack * dense and 2 * R * R < P * Q)


def outer_example_stats(left_BxRxP, right_BxRxQ, want, scale: float = 1.0,
                        slack: float = 1.25):
  """Per-example G_b = s·L_bᵀ R_b (P×Q): Σ_b φ(G_b) and Σ_coords φ(G_b) (e.g. ‖G_b‖²).

  Materialises G (B×P×Q, transient) when a coordinate statistic or an example
  statistic other than norms is asked, or when it is cheaper
  (`ghost_norm_is_cheaper(R, P, Q, slack)`); otherwise
  ‖G_b‖² = s²⟨L_b L_bᵀ, R_b R_bᵀ⟩ (the "ghost norm", Goodfellow 2015).
  """
  out = {}
  _, R, P = left_BxRxP.shape
  Q = right_BxRxQ.shape[-1]
  phis, examples = coordinate_names(want), example_names(want)
  if _needs_materialised(want, ghost_norm_is_cheaper(R, P, Q, slack)):
    g_BxPxQ = jnp.einsum("brp,brq->bpq", left_BxRxP, right_BxRxQ) * scale
    for k in phis:
      out[k] = _phi(k)(g_BxPxQ).sum(axis=0)
    for k in examples:
      out[k] = _phi(k)(g_BxPxQ).sum(axis=(1, 2))
  elif "norms" in examples:
    gram_l_BxRxR = jnp.einsum("brp,bsp->brs", left_BxRxP, left_BxRxP)
    gram_r_BxRxR = jnp.einsum("brq,bsq->brs", right_BxRxQ, right_BxRxQ)
    out["norms"] = (gram_l_BxRxR * gram_r_BxRxR).sum(axis=(1, 2)) * (scale * scale)
  return out


# --- row-sum layers (biases, norm scales) --------------------------------------
def rowsum_token_stats(v_NxP, want):
  """Samples are the rows themselves: Σ_n φ(v_n)."""
  return {k: _phi(k)(v_NxP).sum(axis=0) for k in coordinate_names(want)}


def rowsum_example_stats(v_BxRxP, want):
  """g_b = Σ_r v_br: Σ_b φ(g_b) and Σ_coords φ(g_b) (e.g. ‖g_b‖²)."""
  g_BxP = v_BxRxP.sum(axis=1)
  out = {k: _phi(k)(g_BxP).sum(axis=0) for k in coordinate_names(want)}
  for k in example_names(want):
    out[k] = _phi(k)(g_BxP).sum(axis=-1)
  return out


def sum_examples(v_BxN):
  """Σ_b v_b as a product with a ones vector: a GEMV streams v once, where XLA:CPU's
  reduction over the leading axis is slower."""
  return jnp.dot(jnp.ones((v_BxN.shape[0],), jnp.float32), v_BxN)


def flat_example_stats(g_BxN, want):
  """Per-example gradients g_b (rows of g, already scaled): Σ_b φ(g_b) per coordinate
  and Σ_coords φ(g_b) per example (e.g. ‖g_b‖²)."""
  return {**{k: sum_examples(_phi(k)(g_BxN)) for k in coordinate_names(want)},
          **{k: _phi(k)(g_BxN).sum(axis=1) for k in example_names(want)}}


# --- embedding lookups -----------------------------------------------------------
def lookup_token_stats(ids_N, rows_NxD, num_rows: int, want):
  """Token n adds rows_n to table row ids_n: Σ_n φ(·) = scatter-add of φ(rows_n)."""
  D = rows_NxD.shape[-1]
  return {k: zeros_after(rows_NxD, (num_rows, D)).at[ids_N].add(_phi(k)(rows_NxD))
          for k in coordinate_names(want)}


def combine_repeated_ids(ids_BxR, rows_BxRxD):
  """Per-example segment-sum of rows over equal ids (sort-based, no B×V×D tensor).

  Returns (slot_ids (B*R), slots (B*R)×D): example b owns slots b*R..b*R+R-1; each
  distinct id of example b gets one slot holding the sum of its rows; unused slots
  hold zero vectors (and id 0), which add nothing since φ(0) = 0 (a registry rule).
  """
  B, R = ids_BxR.shape
  order_BxR = jnp.argsort(ids_BxR, axis=1)
  sids_BxR = jnp.take_along_axis(ids_BxR, order_BxR, axis=1)
  srows_BxRxD = jnp.take_along_axis(rows_BxRxD, order_BxR[..., None], axis=1)
  new_BxR = jnp.concatenate(
      [jnp.ones((B, 1), bool), sids_BxR[:, 1:] != sids_BxR[:, :-1]], axis=1)
  seg_N = (jnp.cumsum(new_BxR, axis=1) - 1 + R * jnp.arange(B)[:, None]).reshape(-1)
  srows_NxD = srows_BxRxD.reshape(B * R, -1)
  slots_NxD = zeros_after(srows_NxD, srows_NxD.shape).at[seg_N].add(  # a segment-sum
      srows_NxD, indices_are_sorted=True)
  slot_ids_N = jnp.zeros((B * R,), ids_BxR.dtype).at[seg_N].set(sids_BxR.reshape(-1))
  return slot_ids_N, slots_NxD


def lookup_example_stats(ids_BxR, rows_BxRxD, num_rows: int, want):
  """Per-example gradient of a lookup table: G_b[v] = Σ_{r: ids_br = v} rows_br.

  Sparse: repeated ids in one example are combined before φ (sign(0) = 0 for rows
  the example does not touch).
  """
  B, R, D = rows_BxRxD.shape
  slot_ids_N, slots_NxD = combine_repeated_ids(ids_BxR, rows_BxRxD)
  out = lookup_token_stats(slot_ids_N, slots_NxD, num_rows, want)
  for k in example_names(want):
    out[k] = _phi(k)(slots_NxD).reshape(B, R * D).sum(axis=-1)
  return out


# --- tied input/output embedding ------------------------------------------------------
def tied_token_own_row(ids_N, dout_NxV, x_NxD):
  """u_n = dout_n[ids_n] x_n: row ids_n of token n's output-projection sample."""
  return jnp.take_along_axis(dout_NxV, ids_N[:, None], axis=1) * x_NxD


def tied_token_lookup_stats(ids_N, din_NxD, u_NxD, num_rows: int, want):
  """Correction at row ids_n for a tied table.

  Token n's sample is e_{id_n} din_nᵀ + dout_n x_nᵀ (both uses summed within the
  token). Its φ differs from the output part's φ(dout_n) φ(x_n)ᵀ (accounted for by
  `outer_token_stats`) only on row id_n, by φ(din_n + u_n) - φ(u_n).
  """
  D = din_NxD.shape[-1]
  return {k: zeros_after(din_NxD, (num_rows, D)).at[ids_N].add(
      _phi(k)(din_NxD + u_NxD) - _phi(k)(u_NxD)) for k in coordinate_names(want)}


def tied_example_stats(ids_BxR, din_BxRxD, dout_BxSxV, x_BxSxD, want,
                       unroll: int | bool = 1):
  """Per-example G_b = dout_bᵀ x_b + scatter(ids_b, din_b) (V×D), summed before φ.

  Coordinate statistics or example statistics other than norms: G_b is materialised
  one example at a time (lax.scan with `unroll`, V×D live).
  norms only: ‖G_b‖² = ‖dout_bᵀx_b‖² + 2 Σ_{s,t} dout_b[s, id_bt] ⟨x_bs, din_bt⟩
  + ‖scatter(ids_b, din_b)‖², the first term by the ghost norm when cheaper.
  """
  V, D = dout_BxSxV.shape[-1], x_BxSxD.shape[-1]
  phis, examples = coordinate_names(want), example_names(want)
  if _needs_materialised(want, ghost_ok=True):
    def step(acc, ex):
      ids_R, din_RxD, dout_SxV, x_SxD = ex
      g_VxD = (dout_SxV.T @ x_SxD).at[ids_R].add(din_RxD)
      acc = {k: acc[k] + _phi(k)(g_VxD) for k in phis}
      return acc, {k: _phi(k)(g_VxD).sum() for k in examples}
    acc0 = {k: zeros_after(din_BxRxD, (V, D)) for k in phis}
    out, per_example = jax.lax.scan(step, acc0, (ids_BxR, din_BxRxD, dout_BxSxV, x_BxSxD),
                                    unroll=unroll)
    return {**out, **per_example}
  if "norms" not in examples:
    return {}
  dense_B = outer_example_stats(dout_BxSxV, x_BxSxD, ("norms",))["norms"]  # pre-scaled
  dout_at_ids_BxSxR = jnp.take_along_axis(
      dout_BxSxV, jnp.broadcast_to(ids_BxR[:, None, :], dout_BxSxV.shape[:2] + ids_BxR.shape[1:]),
      axis=2)
  x_din_BxSxR = jnp.einsum("bsd,brd->bsr", x_BxSxD, din_BxRxD)
  cross_B = (dout_at_ids_BxSxR * x_din_BxSxR).sum(axis=(1, 2))
  sparse_B = lookup_example_stats(ids_BxR, din_BxRxD, V, ("norms",))["norms"]
  return {"norms": dense_B + 2.0 * cross_B + sparse_B}
