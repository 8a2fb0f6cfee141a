"""The statistics engine's interface: one clear error per invalid request, the backend
table (a registered backend is called after the dispatcher's checks), the auto rule, and
the stats config presets against the schema."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import pytest
from omegaconf import OmegaConf
from test_stats import ROOT, assert_close, run_backend, setup

import pergrad.stats as ps
from pergrad.config.schema import StatsSpec

# --- invalid requests ----------------------------------------------------------------
INVALID = [
    (dict(want=("mean", "kurtosis")), "unknown statistic"),
    (dict(want="sq", granularity="token", backend="vmap"), "backend='surgery'"),
    (dict(want="sq", granularity="token", backend="loop"), "backend='surgery'"),
    (dict(granularity="sentence"), "unknown granularity"),
    (dict(want=("sq", "norms"), granularity="token"), "only at granularity='example'"),
    (dict(backend="pmap"), "unknown backend"),
    (dict(want="sq", backend="vmap", microbatch_size=3), "positive divisor of the batch size"),
    (dict(want="sq", backend="vmap", microbatch_size=0), "positive divisor"),
    (dict(per_example_clip=-1.0), "must be a positive norm"),
    (dict(want="sq", granularity="token", per_example_clip=1.0), "granularity='example'"),
    (dict(want="sq", backend="value_and_grad"), "mean gradient alone"),
    (dict(want="sq", options=ps.StatsOptions(microbatch_size=2), microbatch_size=4), "disagree"),
]


@pytest.mark.parametrize("kwargs,match", INVALID)
def test_invalid_requests(kwargs, match):
  params, loss_fn, batch = setup("untied-layernorm-learned", 8)
  with pytest.raises(ValueError, match=match):
    ps.compute(loss_fn, params, batch, **kwargs)


def test_registered_backend_gets_request_and_options_after_the_dispatchers_checks():
  """A backend added to the table is called with the request, the options and one chunk
  of the batch, once the dispatcher has checked the request against its declared support."""
  params, loss_fn, batch = setup("untied-layernorm-learned", 8)
  seen = []

  def mine(loss_fn, params, batch, request, options):
    seen.append((request.want, options.vmap_layout, batch["inputs"].shape[0]))
    return ps.backends.get("vmap").fn(loss_fn, params, batch, request, options)

  ps.register_backend("mine", ps.Backend(mine))
  try:
    with pytest.raises(ValueError, match="cannot be redefined"):
      ps.register_backend("vmap", ps.Backend(mine))
    opts = ps.StatsOptions(microbatch_size=4, vmap_layout="first")
    _, stats = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, ps.StatsRequest(("sq",)), opts,
                                               backend="mine"))(params, batch)
    assert seen and set(seen) == {(("mean", "sq"), "first", 4)}  # traced more than once
    _, ref = run_backend("vmap", None, "untied-layernorm-learned", 8)
    assert_close(stats.sum_sq, ref.sum_sq, "registered backend sum_sq")
    for kw, match in ((dict(granularity="token"), "not supported by backend='mine'"),
                      (dict(per_example_clip=1.0), "per_example_clip is not supported")):
      with pytest.raises(ValueError, match=match):
        ps.compute(loss_fn, params, batch, want="sq", backend="mine", **kw)
  finally:
    ps.unregister_backend("mine")
  with pytest.raises(ValueError, match="unknown backend 'mine'"):
    ps.compute(loss_fn, params, batch, want="sq", backend="mine")


def test_invalid_inputs():
  params, loss_fn, batch = setup("untied-layernorm-learned", 3)
  with pytest.raises(ValueError, match="per-example losses of shape"):
    ps.compute(lambda p, b: loss_fn(p, b).mean(), params, batch, want="sq", backend="vmap")
  bad = dict(batch, targets=batch["targets"][:2])
  with pytest.raises(ValueError, match="same leading"):
    ps.compute(loss_fn, params, bad)
  with pytest.raises(ValueError, match="without 'sq'"):
    _ = ps.GradStats(count=jnp.float32(3), sum=params).variance


def test_a_microbatched_request_without_a_kind_has_an_empty_table_of_it():
  """The microbatch loop of a request with no coordinate statistic (mean and norms: a GNS
  tracker's) returns an empty coordinate table, not None (`has("sq")` crashed on it in
  gns_ramp's ci run); likewise an empty example table without norms."""
  params, loss_fn, batch = setup("untied-layernorm-learned", 4)
  for backend in ("surgery", "vmap"):
    _, stats = ps.compute(loss_fn, params, batch, want=("mean", "norms"), backend=backend,
                          microbatch_size=2)
    assert stats.has("norms") and not stats.has("sq") and stats.coordinate_stats == {}
    _, stats = ps.compute(loss_fn, params, batch, want=("sq",), backend=backend,
                          microbatch_size=2)
    assert stats.has("sq") and not stats.has("norms") and stats.example_stats == {}
  empty = ps.GradStats(count=jnp.float32(2), coordinate_stats=None, example_stats=None)
  assert (empty.coordinate_stats, empty.example_stats) == ({}, {})  # the class coerces None


def test_auto_backend_rule():
  R = ps.StatsRequest
  assert ps.resolve_backend(R(("mean",))) == "contraction"  # the plain step on CPU
  assert ps.resolve_backend(R(("mean",)), "value_and_grad") == "value_and_grad"
  assert ps.resolve_backend(R(("mean",), per_example_clip=1.0)) == "surgery"
  assert ps.resolve_backend(R(("sq",), per_example_clip=1.0)) == "surgery"
  assert ps.resolve_backend(R(("sq", "sign"))) == "surgery"  # measured fastest on CPU
  assert ps.resolve_backend(R(("norms",))) == "surgery"
  assert ps.resolve_backend(R(("sq",), granularity="token")) == "surgery"


# --- configs and benchmark -----------------------------------------------------------
def test_stats_configs_merge_into_schema():
  folder = os.path.join(ROOT, "configs", "stats")
  names = sorted(f for f in os.listdir(folder) if f.endswith(".yaml"))
  assert names
  for f in names:
    cfg = OmegaConf.merge(OmegaConf.structured(StatsSpec),
                          OmegaConf.load(os.path.join(folder, f)))
    ps.resolve_backend(ps.StatsRequest(tuple(cfg.want) or ("mean",), cfg.granularity.value),
                       cfg.backend)
