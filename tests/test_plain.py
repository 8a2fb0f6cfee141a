"""The plain step's ḡ microbatched (`pergrad.train.plain`): equal to the whole batch's on
every parameter leaf (float32 rounding), for both plain backends; the rule of chunks."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import TINY, compose

import pergrad.stats as pstats
from pergrad.config import build_plan
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer, init_params
from pergrad.train import plain


def test_chunk_rule():
  assert plain.chunk_for(32, "cpu") == 8 and plain.chunk_for(128, "cpu") == 8
  assert plain.chunk_for(8, "cpu") is None  # one chunk: the whole batch
  assert plain.chunk_for(12, "cpu") is None  # 8 does not divide 12
  assert plain.chunk_for(32, "gpu") is None and plain.chunk_for(32, "tpu") is None
  assert plain.chunk_for(32, "gpu", asked=4) == 4  # stats.microbatch_size wins
  vag = "value_and_grad"  # its own chunk on CPU: 4 (pergrad.train.plain's docstring)
  assert plain.chunk_for(8, "cpu", backend=vag) == 4 == plain.chunk_for(32, "cpu", None, vag)
  assert plain.chunk_for(6, "cpu", backend=vag) is None
  assert plain.chunk_for(8, "gpu", backend=vag) is None
  assert plain.chunk_for(32, "cpu", backend="contraction") == 8


@pytest.mark.parametrize("backend,asked", [("value_and_grad", None), ("contraction", 4)])
def test_microbatched_mean_gradient_equals_the_whole_batch(backend, asked):
  plan = build_plan(compose([*TINY, "data.batch_size=16"]))
  loss_fn = make_loss_fn(Transformer(plan.model))
  params = init_params(plan.model, jax.random.PRNGKey(1), plan.data.seq_len)
  tokens = np.random.default_rng(2).integers(0, 256, (16, plan.data.seq_len + 1), np.int32)
  batch = {"inputs": jnp.asarray(tokens[:, :-1]), "targets": jnp.asarray(tokens[:, 1:])}
  request = pstats.StatsRequest()
  want_loss, want = jax.jit(lambda p, b: pstats.compute(loss_fn, p, b, request,
                                                        backend="value_and_grad"))(params, batch)
  options = pstats.StatsOptions(microbatch_size=asked)
  loss, got = jax.jit(lambda p, b: plain.mean_gradient(loss_fn, p, b, request, options,
                                                       backend))(params, batch)
  if jax.default_backend() == "cpu" or asked:
    assert plain.chunk_for(16, jax.default_backend(), asked, backend) in (4, 8)  # it split
  np.testing.assert_allclose(loss, want_loss, rtol=1e-6)
  assert float(got.count) == 16
  leaves = jax.tree_util.tree_leaves_with_path(want.mean)
  for (path, w), g in zip(leaves, jax.tree.leaves(got.mean), strict=True):
    np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6 * float(jnp.max(jnp.abs(w))),
                               err_msg=jax.tree_util.keystr(path))


def test_statistics_backends_get_the_chunk_in_their_own_loop():
  """`chunked`: a statistics backend that microbatches gets chunk_for's chunk where none is
  set (its merge is `pergrad.stats.compute`'s, tested with the engine); a plain one and a
  chunk already set are left alone."""
  opts = pstats.StatsOptions()
  platform_chunk = plain.chunk_for(32, jax.default_backend())
  assert plain.chunked(opts, 32, "vmap").microbatch_size == platform_chunk
  assert plain.chunked(opts, 32, "surgery").microbatch_size == platform_chunk
  assert plain.chunked(opts, 32, "loop").microbatch_size is None  # no loop of its own
  assert plain.chunked(opts, 32, "value_and_grad") is opts
  assert plain.chunked(opts, 8, "vmap").microbatch_size is None
  set_ = pstats.StatsOptions(microbatch_size=4)
  assert plain.chunked(set_, 32, "vmap") is set_
