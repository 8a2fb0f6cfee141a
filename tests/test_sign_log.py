"""The sign agreement logged during training (`stats.sign_agreement`,
`pergrad.train.heldout`): logged on statistics-logging steps only, for the update and each
stage's direction against the current and the lagged target, the trajectory bit-identical
with and without it (and without 'sign' in stats.want), the update's counts equal to a
NumPy recomputation and to those of the stage its sign is taken from, the lag state
resumed, and one-line errors for bad settings.

Runs: the 1-layer, 32-wide model of conftest.TINY, SignEMA, 6 steps, statistics at
steps 1, 3 and 6.
"""

from __future__ import annotations

import signal
from pathlib import Path

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from conftest import compose

from pergrad.config import build_plan
from pergrad.config.plan import marked_keys
from pergrad.config.schema import StatsSpec
from pergrad.stats import noise
from pergrad.stats.sign_agreement import SignCounts
from pergrad.train.heldout import STAGES, prefix
from pergrad.train.interrupt import Interrupts
from pergrad.train.loop import run
from pergrad.train.metrics import read_records

pytestmark = pytest.mark.extended  # trains with held-out statistics (module fixture)

N_H = 2
BASE = ("train.steps=6", "train.eval_every=6", "train.checkpoint_every=6",
        "logging.log_every=1", "optimizer=sign", "optimizer.placement=ema",
        "optimizer.lr=1e-2", "stats.log_every=3", "stats.track_snr=true")
LOGGED = (1, 3, 6)
FIELDS = SignCounts._fields


@pytest.fixture(scope="module", autouse=True)
def _cache(compilation_cache):
  return compilation_cache


def _overrides(tiny, n_h, *extra):
  want = "stats.want=[mean,sq,sign]" if n_h else "stats.want=[mean,sq]"
  return [*tiny, *BASE, want, f"stats.sign_agreement={n_h}", *extra]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, tiny_overrides):
  """{n_h: run dir} for the same run with the sign agreement off (0, no 'sign' logged) and
  on (N_H, with the per-example signs' direction)."""
  out = {}
  for n_h in (0, N_H):
    d = tmp_path_factory.mktemp(f"sign{n_h}")
    run(build_plan(compose(_overrides(tiny_overrides, n_h))), d, echo=lambda s: None)
    out[n_h] = d
  return out


PREFIXES = [prefix(d, lag) for d in ("update", *STAGES) for lag in (False, True)]


def _records(d: Path, split: str) -> list[dict]:
  return [r for r in read_records(d / "metrics.jsonl") if r["split"] == split]


def _params(d: Path):
  return ocp.StandardCheckpointer().restore((d / "checkpoints" / "6" / "default").absolute()
                                            )["params"]


def test_counts_are_logged_on_statistics_steps_only(runs):
  d = runs[N_H]
  signed = {r["step"]: r for r in read_records(d / "metrics.jsonl")
            if any(k.startswith("sign/") for k in r)}
  assert sorted(signed) == list(LOGGED)
  assert all(r["split"] == "stats" for r in signed.values())
  leaves = noise.leaf_paths(_params(d))
  want = {f"{p}/{leaf}/{f}" for p in PREFIXES for leaf in (*leaves, "total") for f in FIELDS}
  for r in signed.values():
    assert {k for k in r if k.startswith("sign")} == want
    for p in PREFIXES:
      assert r[f"{p}/total/coords"] == sum(r[f"{p}/{leaf}/coords"] for leaf in leaves)
      assert 0 < r[f"{p}/total/agree"] <= r[f"{p}/total/selected"] <= r[f"{p}/total/coords"]
  # The lagged target is the current one at the first logging step, not later.
  first, last = signed[LOGGED[0]], signed[LOGGED[-1]]
  for f in ("agree_all", "progress"):
    np.testing.assert_allclose(first[f"sign_lag/total/{f}"], first[f"sign/total/{f}"], rtol=1e-5)
  assert last["sign_lag/total/selected"] != last["sign/total/selected"]
  off = read_records(runs[0] / "metrics.jsonl")
  assert off and not any(k.startswith("sign") for r in off for k in r)


@pytest.fixture(scope="module")
def parity_runs(tmp_path_factory, tiny_overrides):
  """{placement: run dir} of the batch and example placements with β = 0 (the update has
  the sign of ḡ, of the mean of per-example signs)."""
  out = {}
  for k in ("batch", "example"):
    d = tmp_path_factory.mktemp(f"parity_{k}")
    run(build_plan(compose(_overrides(tiny_overrides, N_H, f"optimizer.placement={k}",
                                      "optimizer.b1=0"))), d, echo=lambda s: None)
    out[k] = d
  return out


def test_stage_counts_equal_the_updates_of_that_placement(runs, parity_runs):
  """The stage a placement takes its sign from has the update's counts (the same signs),
  against both targets: ema in the SignEMA run; batch and example with β = 0."""
  cases = [("ema", runs[N_H]), *((k, d) for k, d in parity_runs.items())]
  for stage, d in cases:
    recs = [r for r in _records(d, "stats") if "sign/total/coords" in r]
    assert [r["step"] for r in recs] == list(LOGGED), stage
    for r in recs:
      for lag in (False, True):
        own, other = prefix("update", lag), prefix(stage, lag)
        keys = [k for k in r if k.startswith(own + "/")]
        assert {k.replace(own, other, 1) for k in keys} <= set(r)
        for k in keys:  # counts exactly; sums of h in any order (rounding)
          exact = k.split("/")[-1] not in ("progress", "mu2")
          np.testing.assert_allclose(r[k.replace(own, other, 1)], r[k], rtol=0 if exact else 1e-5,
                                     err_msg=f"{stage} {k}")
        assert r[f"{prefix('example', lag)}/total/progress"] != r[f"{own}/total/progress"] or (
            stage == "example")


class _StopAt(Interrupts):
  """Requests a stop before update `k` + 1 (as a SIGTERM would)."""

  def __init__(self, k):
    super().__init__()
    self.k = k

  def requested(self, k):
    if k == self.k:
      self.signum = signal.SIGTERM
    return self.signum is not None


def test_resume_keeps_the_lag_state(runs, tiny_overrides, tmp_path):
  """Interrupted after update 4 (logging steps 1 and 3 behind it), checkpointed, resumed:
  the lagged counts of step 6 are the uninterrupted run's, and the checkpoint holds the
  lag state."""
  plan = build_plan(compose(_overrides(tiny_overrides, N_H)))
  assert run(plan, tmp_path, echo=lambda s: None, stop=_StopAt(4))["status"] == "interrupted"
  saved = ocp.StandardCheckpointer().restore((tmp_path / "checkpoints" / "4" / "default")
                                             .absolute())
  assert float(saved["lag"]["weight"]) == pytest.approx(0.75)  # 1 − ρ² after 2 logging steps
  assert run(plan, tmp_path, echo=lambda s: None)["status"] == "completed"
  got, want = (next(r for r in _records(d, "stats") if r["step"] == 6)
               for d in (tmp_path, runs[N_H]))
  lagged = [k for k in want if k.startswith("sign_lag")]
  assert lagged and [got[k] for k in lagged] == [want[k] for k in lagged]


def test_trajectory_is_bit_identical_with_and_without(runs):
  on, off = _params(runs[N_H]), _params(runs[0])
  la, lb = jax.tree.leaves(on), jax.tree.leaves(off)
  assert len(la) == len(lb) > 0
  for x, y in zip(la, lb, strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
  assert ([r["loss"] for r in _records(runs[N_H], "train")]
          == [r["loss"] for r in _records(runs[0], "train")])


def _numpy_counts(u, h, v, n, z=4.0):
  """`sign_agreement.counts` in NumPy (float32 elementwise, float64 sums)."""
  su, sh = np.sign(u), np.sign(h)
  same = (su == sh) & (su != 0)
  t2 = np.square(h) * np.float32(n) / np.maximum(v, np.finfo(np.float32).tiny)
  sel = (t2 >= z * z) & (sh != 0)
  return {"coords": u.size, "agree_all": same.sum(), "selected": sel.sum(),
          "agree": (same & sel).sum(), "progress": np.sum(su * h, dtype=np.float64),
          "mu2": np.sum(np.square(h) - v / np.float32(n), dtype=np.float64)}


def test_logged_counts_equal_numpy_from_the_update_and_heldout_stats(runs, tiny_overrides):
  """Step 1 again, piece by piece: the update of the logging step and the held-out
  statistics at the initial parameters; their counts recomputed in NumPy equal the
  counts the run logged."""
  import jax.numpy as jnp

  from pergrad.data import make_data
  from pergrad.train.heldout import HeldOutData
  from pergrad.train.mesh import make_mesh
  from pergrad.train.step import Steps

  plan = build_plan(compose(_overrides(tiny_overrides, N_H)))
  data, B = make_data(plan.data), plan.batch.max_batch_size
  steps = Steps(plan, make_mesh())
  held = HeldOutData(data, N_H, B)
  host = held.batch(0)
  assert host["inputs"].shape == (N_H * B, plan.data.seq_len)
  np.testing.assert_array_equal(host["inputs"], held.batch(0)["inputs"])  # deterministic
  train_rows = data.train_examples(0, N_H * B)["inputs"]
  assert not any((row == train_rows).all(axis=1).any() for row in host["inputs"])

  state = steps.init(jnp.int32(plan.train.seed))
  stats = steps.sign.stats(state.params, steps.put_batch(host))
  before = jax.device_get(state.params)
  after, metrics = steps.train_logged[B](state, steps.put_batch(data.train_examples(0, B)),
                                         stats)
  n = float(stats.count)
  assert n == N_H * B
  # u = −update = θ_0 − θ_1: SignEMA's first update is −lr·sign(ḡ), |u| = lr (or 0) far
  # above the rounding of θ, so the difference has the update's signs exactly.
  u = np.concatenate([np.ravel(a - b) for a, b in zip(
      jax.tree.leaves(before), jax.tree.leaves(jax.device_get(after.params)), strict=True)])
  np.testing.assert_allclose(np.abs(u[u != 0]), plan.optimizer.learning_rate(0), rtol=1e-3)
  h = np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(stats.mean))])
  v = np.concatenate([np.ravel(x) for x in jax.tree.leaves(jax.device_get(stats.variance))])
  want = _numpy_counts(u, h, v, n)
  logged = next(r for r in _records(runs[N_H], "stats") if r["step"] == 1)
  for f in ("coords", "agree_all", "selected", "agree"):
    assert logged[f"sign/total/{f}"] == want[f], f
  for key, value in jax.device_get(metrics).items():  # what the step returned was logged
    if key.startswith("sign/"):
      np.testing.assert_allclose(logged[key], value, rtol=1e-6, err_msg=key)
  for f in ("progress", "mu2"):
    np.testing.assert_allclose(logged[f"sign/total/{f}"], want[f], rtol=1e-4)


@pytest.mark.parametrize("override,match", [
    ("stats.sign_agreement=-1", r"^stats.sign_agreement=-1 must be >= 0 \(0: off"),
    ("stats.log_every=0", r"^stats.sign_agreement=2 is logged on statistics-logging steps, "
                          r"but stats.log_every=0"),
    ("stats.sign_lag=1", r"^stats.sign_lag=1(\.0)? must be in \[0, 1\)"),
])
def test_bad_settings_are_one_line_errors(override, match):
  with pytest.raises(ValueError, match=match) as e:
    build_plan(compose([*BASE, "stats.sign_agreement=2", override]))
  assert "\n" not in str(e.value)
  with pytest.raises(ValueError, match=r"^stats.sign_agreement=-4 must be >= 0"):
    StatsSpec(sign_agreement=-4, log_every=10)


def test_the_setting_is_resumable():
  assert {"stats.sign_agreement", "stats.sign_lag"} <= set(marked_keys())


def test_resume_turning_the_sign_agreement_on(runs, tiny_overrides, tmp_path):
  """stats.sign_agreement is resumable: a checkpoint without the lag state resumes with it
  (fresh: the lagged target is the current one at the first logging step after), on the
  same trajectory."""
  off = build_plan(compose(_overrides(tiny_overrides, 0)))
  assert run(off, tmp_path, echo=lambda s: None, stop=_StopAt(4))["status"] == "interrupted"
  on = build_plan(compose(_overrides(tiny_overrides, N_H)))
  assert run(on, tmp_path, echo=print)["status"] == "completed"
  r = next(r for r in _records(tmp_path, "stats") if r["step"] == 6)
  assert r["sign_lag/total/agree_all"] == r["sign/total/agree_all"]
  for x, y in zip(jax.tree.leaves(_params(tmp_path)), jax.tree.leaves(_params(runs[N_H])),
                  strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
