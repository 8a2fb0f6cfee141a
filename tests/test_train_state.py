"""The train state (`pergrad.train.state`): the trackers sit beside the optimizer, so the
optimizer state and its checkpointed subtree are the same with the SNR / GNS diagnostics on
and off, and `train_step` returns (state, metrics) in every variant. Shapes only
(`jax.eval_shape`), plus one saved checkpoint per setting (the init state, no training)."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
import pytest
from conftest import compose

from pergrad.config import build_plan
from pergrad.loss import make_loss_fn
from pergrad.model import Transformer
from pergrad.optim import GnsTrackerState, ScaleByAdamFamilyState, SnrTrackerState
from pergrad.train import plain
from pergrad.train.checkpoint import Checkpoints, IncompatibleCheckpoint
from pergrad.train.heldout import heldout_stats
from pergrad.train.state import TrainState, make_init_fn
from pergrad.train.step import train_step

SETTINGS = {"off": (), "snr": ("stats.track_snr=true",), "gns": ("stats.gns=true",),
            "both": ("stats.track_snr=true", "stats.gns=true")}


@functools.cache
def _plan(tiny: tuple[str, ...], name: str):
  return build_plan(compose([*tiny, "optimizer=adamw", "stats.log_every=2",
                             "stats.sign_agreement=1", *SETTINGS[name]]))


def _abstract_state(plan) -> TrainState:
  init = make_init_fn(plan.model, plan.optimizer, plan.data.seq_len,
                      lag=bool(plan.stats.sign_agreement))
  return jax.eval_shape(init, jnp.int32(0))


def _shapes(tree):
  return jax.tree.structure(tree), [(x.shape, x.dtype) for x in jax.tree.leaves(tree)]


def test_optimizer_state_is_the_same_with_diagnostics_on_and_off(tiny_overrides):
  states = {name: _abstract_state(_plan(tiny_overrides, name)) for name in SETTINGS}
  off = states.pop("off")
  assert off.snr == optax.EmptyState() and off.gns == optax.EmptyState()
  for name, st in states.items():
    assert _shapes(st.opt_state) == _shapes(off.opt_state), name
    assert isinstance(st.snr, SnrTrackerState) == ("snr" in name or name == "both")
    assert isinstance(st.gns, GnsTrackerState) == (name in ("gns", "both"))
  for field in ("step", "examples_seen", "batch_size"):
    assert getattr(off, field).dtype == jnp.int32 and getattr(off, field).shape == ()
  assert off.lr.dtype == jnp.float32


def test_checkpointed_optimizer_subtree_is_the_same_with_gns_on_and_off(tiny_overrides,
                                                                       tmp_path):
  saved = {}
  for name in ("off", "gns"):
    plan = _plan(tiny_overrides, name)
    state = jax.jit(make_init_fn(plan.model, plan.optimizer, plan.data.seq_len))(
        jnp.int32(plan.train.seed))
    ckpt = Checkpoints(tmp_path / name, keep=1)
    ckpt.save(0, state)
    ckpt.wait()
    ckpt.close()
    tree = ocp.StandardCheckpointer().restore((tmp_path / name / "0" / "default").absolute())
    saved[name] = tree
  assert _shapes(saved["gns"]["opt_state"]) == _shapes(saved["off"]["opt_state"])
  assert saved["gns"]["gns"] and not saved["off"].get("gns")
  for a, b in zip(jax.tree.leaves(saved["gns"]["opt_state"]),
                  jax.tree.leaves(saved["off"]["opt_state"]), strict=True):
    assert (a == b).all()  # the same initial values too


@pytest.mark.parametrize("name", list(SETTINGS))
def test_train_step_returns_state_and_metrics_in_every_variant(tiny_overrides, name):
  plan = _plan(tiny_overrides, name)
  sp, B, T = plan.stats, plan.batch.max_batch_size, plan.data.seq_len
  loss_fn = make_loss_fn(Transformer(plan.model))
  state = _abstract_state(plan)
  batch = {k: jax.ShapeDtypeStruct((B, T), jnp.int32) for k in ("inputs", "targets")}
  sp = plain.decided(sp, loss_fn, state.params, batch, jax.default_backend())  # "auto" decided
  options = sp.options
  heldout = jax.eval_shape(
      functools.partial(heldout_stats, loss_fn=loss_fn, backend=sp.sign_backend,
                        options=options), state.params,
      {k: jax.ShapeDtypeStruct((B, T), jnp.int32) for k in ("inputs", "targets")})
  assert heldout.sum_sq is not None
  step = functools.partial(train_step, loss_fn=loss_fn, opt=plan.optimizer, options=options)
  variants = {
      "plain": (functools.partial(step, request=sp.request, backend=sp.backend), ()),
      "logged": (functools.partial(step, request=sp.request, backend=sp.backend,
                                   log_request=sp.log_request, log_backend=sp.log_backend), ()),
      "logged+sign": (functools.partial(step, request=sp.request, backend=sp.backend,
                                        log_request=sp.log_request,
                                        log_backend=sp.log_backend), (heldout,)),
  }
  keys = {}
  for variant, (fn, extra) in variants.items():
    out = jax.eval_shape(fn, state, batch, *extra)
    assert isinstance(out, tuple) and len(out) == 2, variant
    new, metrics = out
    assert isinstance(new, TrainState) and _shapes(new) == _shapes(state), variant
    assert all(v.shape == () for v in metrics.values()), variant
    keys[variant] = set(metrics)
  assert {"loss", "lr", "grad_norm", "update_norm", "param_norm"} <= keys["plain"]
  assert any(k.startswith("gns/") for k in keys["plain"]) == ("gns" in name or name == "both")
  assert keys["plain"] < keys["logged"] < keys["logged+sign"]
  assert all(k.split("/")[0].startswith("sign") for k in keys["logged+sign"] - keys["logged"])
  assert {"sign/total/agree", "sign_lag/total/agree"} <= keys["logged+sign"]
  assert ("opt/all/snr2_ema" in keys["logged"]) == (name in ("snr", "both"))


def test_a_checkpoint_whose_chain_held_eps_is_refused_in_one_line(tiny_overrides, tmp_path):
  """Before issue 38 the Adam family's chain held its ε (2 more arrays in the optimizer
  state): such a checkpoint is refused with one line, and left where it is."""
  plan = _plan(tiny_overrides, "off")
  init = make_init_fn(plan.model, plan.optimizer, plan.data.seq_len)
  state = jax.jit(init)(jnp.int32(plan.train.seed))
  parts = list(state.opt_state.inner_state)
  i = next(i for i, p in enumerate(parts) if isinstance(p, ScaleByAdamFamilyState))
  parts[i] = (parts[i], (jnp.float32(1e-8), jnp.float32(0.0)))  # the old chain: (adam, ε)
  ckpt = Checkpoints(tmp_path / "checkpoints", keep=1)
  ckpt.save(4, state.replace(opt_state=state.opt_state._replace(inner_state=tuple(parts))))
  ckpt.wait()
  with pytest.raises(IncompatibleCheckpoint) as e:
    ckpt.restore_latest(jax.eval_shape(init, jnp.int32(0)), fresh={})
  ckpt.close()
  message = str(e.value)
  assert "\n" not in message and "step 4" in message and "eps" in message
  assert "another train.out_dir" in message
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["4"]  # not moved aside


def test_a_checkpoint_whose_optimizer_state_held_no_numbers_is_refused_in_one_line(
    tiny_overrides, tmp_path):
  """Before issue 55 the optimizer state was the chain's alone (its lr, β's and ε were
  the step's arguments): such a checkpoint is refused with one line, and left where it is."""
  plan = _plan(tiny_overrides, "off")
  init = make_init_fn(plan.model, plan.optimizer, plan.data.seq_len)
  state = jax.jit(init)(jnp.int32(plan.train.seed))
  assert float(state.opt_state.hyperparams["lr"]) == pytest.approx(plan.optimizer.hparams.lr)
  ckpt = Checkpoints(tmp_path / "checkpoints", keep=1)
  ckpt.save(6, state.replace(opt_state=state.opt_state.inner_state))  # the old layout
  ckpt.wait()
  with pytest.raises(IncompatibleCheckpoint) as e:
    ckpt.restore_latest(jax.eval_shape(init, jnp.int32(0)), fresh={})
  ckpt.close()
  message = str(e.value)
  assert "\n" not in message and "step 6" in message and "lr, betas and eps" in message
  assert "another train.out_dir" in message
  assert [p.name for p in (tmp_path / "checkpoints").iterdir()] == ["6"]  # not moved aside
