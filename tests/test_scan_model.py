"""ModelSpec.scan_layers: the scanned transformer (nn.scan over stacked blocks, remat) is the
unscanned one with its block parameters stacked, params["blocks"][l] = params["block_l"]:
the same per-example losses, and the same surgery statistics leaf by leaf (a stacked
leaf's slice l is block l's leaf; its per-example squared norm is the sum of the
blocks'); `auto` takes surgery for it.
"""

import dataclasses

import jax
import numpy as np
import pytest

import pergrad.stats as ps
from pergrad.loss import make_loss_fn
from pergrad.model import SCANNED_BLOCKS, ModelSpec, Transformer, init_params, stack_blocks

L, B, T = 3, 4, 16
SPEC = ModelSpec(n_layers=L, d_model=16, n_heads=2, d_ff=24, vocab_size=29, seq_len=T)
ALL = ("mean", "sq", "sign", "norms")


def _setup(**kw):
  spec = dataclasses.replace(SPEC, **kw)
  scanned = dataclasses.replace(spec, scan_layers=True)
  params = init_params(spec, jax.random.PRNGKey(0), T)
  toks = jax.random.randint(jax.random.PRNGKey(1), (B, T + 1), 0, spec.vocab_size)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  return (make_loss_fn(Transformer(spec)), params, make_loss_fn(Transformer(scanned)),
          stack_blocks(params, L), batch)


def test_scanned_params_are_the_stacked_blocks():
  scanned = dataclasses.replace(SPEC, scan_layers=True)
  got = init_params(scanned, jax.random.PRNGKey(0), T)
  want = stack_blocks(init_params(SPEC, jax.random.PRNGKey(0), T), L)
  assert jax.tree.map(np.shape, got) == jax.tree.map(np.shape, want)
  assert all(x.shape[0] == L for x in jax.tree.leaves(got[SCANNED_BLOCKS]))


def _stats(loss_fn, params, batch):
  fn = lambda p, b: ps.compute(loss_fn, p, b, ps.StatsRequest(ALL), backend="surgery")
  return jax.device_get(jax.jit(fn)(params, batch))


def _summed_blocks(tree):
  """An unscanned tree of per-example norms [B] with its blocks summed: a stacked leaf's
  squared norm is the sum over l of block l's."""
  blocks = [tree[f"block_{i}"] for i in range(L)]
  rest = {k: v for k, v in tree.items() if not k.startswith("block_")}
  return {**rest, SCANNED_BLOCKS: jax.tree.map(lambda *x: sum(x), *blocks)}


@pytest.mark.parametrize("kw", [{}, dict(norm="rmsnorm", positions="rope",
                                         tie_embeddings=True, use_bias=True)],
                         ids=["ln-learned", "rms-rope-tied-bias"])
def test_scanned_losses_and_surgery_stats_equal_unscanned(kw):
  loss_u, p_u, loss_s, p_s, batch = _setup(**kw)
  np.testing.assert_allclose(loss_s(p_s, batch), loss_u(p_u, batch), rtol=1e-5)
  (lu, su), (ls, ss) = _stats(loss_u, p_u, batch), _stats(loss_s, p_s, batch)
  np.testing.assert_allclose(ls, lu, rtol=1e-5)
  pairs = {"sum": (su.sum, ss.sum),
           "sq": (su.coordinate_stats["sq"], ss.coordinate_stats["sq"]),
           "sign": (su.coordinate_stats["sign"], ss.coordinate_stats["sign"]),
           "norms": (su.example_stats["norms"], ss.example_stats["norms"])}
  for what, (u, s) in pairs.items():
    u = _summed_blocks(u) if what == "norms" else stack_blocks(u, L)
    assert jax.tree.structure(s) == jax.tree.structure(u), what
    for (kp, a), b in zip(jax.tree_util.tree_flatten_with_path(u)[0], jax.tree.leaves(s),
                          strict=True):
      scale = max(float(np.abs(a).max()), 1e-12)
      if what == "sign":  # a coordinate whose gradient is ~0 may flip: compare the rest
        np.testing.assert_allclose(b, a, atol=2.01, err_msg=f"{what} {kp}")
        assert np.mean(np.abs(b - a) > 1e-5) < 0.01, f"{what} {kp}"
      else:
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=1e-5 * scale,
                                   err_msg=f"{what} {jax.tree_util.keystr(kp)}")


def test_auto_takes_surgery_for_the_scanned_model():
  _, _, loss_s, p_s, batch = _setup()
  assert ps.decide(loss_s, p_s, batch, ps.StatsRequest(ALL)) == "surgery"
