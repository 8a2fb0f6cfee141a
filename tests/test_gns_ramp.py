"""G3, the paper's test (`experiments.gns_ramp`) on constructed runs: its plan (B_max/8 to
B_max, ~20 tokens per parameter), the ramp against the fixed B_max run at its lr, the token
saving, and the regime guard firing on an over-parameterised model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd
from conftest import as_planned

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from experiments import gns_ramp as gr  # noqa: E402
from pergrad.analysis import runs  # noqa: E402
from pergrad.analysis.runs import read_csv  # noqa: E402
from pergrad.sweep import record  # noqa: E402

BUDGET, LR = 819_200, 0.02  # tokens, the fixed run's best lr


def _table(ramp_speed: float, seeds=(1, 2, 3, 4, 5, 6), n_evals=25) -> pd.DataFrame:
  """L(x) = 3 + 4·exp(−3·s·x / budget) (a per-seed jitter of s): the fixed run (s = 1) on seed
  0 at three lrs (the others 10 % slower) and fresh seeds at LR, the ramp (s = ramp_speed) and
  the short arm (82 % of the tokens) at LR."""
  rows = []
  arms = [("fixed", 200, lr, 0, 1.0 if lr == LR else 0.9, 1.0) for lr in (0.01, LR, 0.04)]
  arms += [("fixed", 200, LR, s, 1.0, 1.0) for s in seeds]
  arms += [("linear", None, LR, s, ramp_speed, 1.0) for s in seeds]
  arms += [("fixed", 164, LR, s, 1.0, 0.82) for s in seeds[:3]]
  for kind, steps, lr, seed, speed, share in arms:
    name = runs.run_dirname({"batch.kind": kind, "optimizer.lr": lr, "train.seed": seed,
                             **({"train.steps": steps} if steps else {})})
    for i in range(n_evals + 1):
      x = share * BUDGET * i / n_evals
      loss = 3 + 4 * np.exp(-3 * speed * (1 + 0.01 * (seed - 3)) * x / BUDGET)
      rows.append({"run": name, "status": "completed", "batch.kind": kind,
                   "train.steps": steps if steps else np.nan, "optimizer.lr": lr,
                   "train.seed": seed, "step": 8 * i, "eval/loss": loss, "train/loss": loss,
                   "eval/tokens_seen": x, "train/tokens_seen": x,
                   "train/train_time_s": x / 1e4, "train/batch_size": 64 if steps else 8 + i})
  return pd.DataFrame(rows)


def _report(tmp_path, name, table, overrides=("experiment=gns_ramp", "scale=cpu"),
            ramp_warmup=20):
  d = tmp_path / name
  d.mkdir()
  fin = runs.finals(table)
  for r in fin["run"]:  # each run's warmup, as Hydra records its config
    (d / r / ".hydra").mkdir(parents=True)
    w = ramp_warmup if "batch.kind=linear" in r else 20
    (d / r / ".hydra" / "config.yaml").write_text(f"schedule:\n  warmup_steps: {w}\n")
  table.attrs["overrides"] = list(overrides)
  gr.analyze(record.Runs(d, table, fin), d)
  assert gr.figures(d)[0].exists()
  return gr.report(as_planned(d)), d


def test_gns_ramp_plan_is_the_papers():
  sw = gr.sweep("cpu")
  b = sw.base
  assert b["data.batch_size"] == 64 and b["batch.start"] == 8  # B_max / 8 (the paper: / 7.5)
  assert b["batch.sizes"] == [8, 16, 24, 32, 40, 48, 56, 64]  # a ramp, not powers of two
  assert sw.blocks[0].grid["train.steps"] == [200] and b["schedule.warmup_steps"] >= 20
  assert len(sw.lr_search.seeds) == 6 and sw.lr_search.max_extend == gr.MAX_EXTEND == 4


def test_gns_ramp_wins_and_saves_tokens(tmp_path):
  rep, d = _report(tmp_path, "faster", _table(1.3))
  assert rep.verdict == "reproduced", (rep.finding, rep.guards_text())
  assert [g["name"] for g in rep.guards] == ["bracketed", "stable", "warm", "in_regime",
                                            "pilot", "same_budget", "powered"]  # one warm guard
  short, _ = _report(tmp_path, "cold_ramp", _table(1.3), ramp_warmup=5)
  assert short.verdict == "undetermined: warm" and short.rule_verdict == "reproduced"
  regime = read_csv(d / "regime.csv")
  assert regime["n_params"].iloc[0] == 40_096
  assert 19 < regime["tokens_per_param"].iloc[0] < 21  # Chinchilla-proportioned
  assert "token saving to fixed B_max's final loss: ramp 2" in rep.ours  # 1 − 1/1.3 ≈ 23 %
  assert "Δ18 = 0.1" in rep.finding  # the short arm ends higher


def test_gns_ramp_tie_is_not_reproduced_and_the_regime_guard_fires(tmp_path):
  rep, _ = _report(tmp_path, "same", _table(1.0))
  assert rep.verdict == "not reproduced", rep.finding  # a tie at power ≥ 0.8
  rep, _ = _report(tmp_path, "big", _table(1.3), overrides=(
      "experiment=gns_ramp", "scale=cpu", "model.d_model=128", "model.d_ff=512"))
  assert rep.verdict == "undetermined: in_regime", rep.guards_text()
  assert "tokens per parameter 1." in rep.guards_text()  # ~1.3 tokens per parameter


def test_the_reference_reaches_its_own_target_whatever_the_float_order():
  """The target (the mean of the fixed runs' last evals) and the fixed arm's seed-mean curve
  sum the same floats in another order; where the curve's last point lands an ulp above the
  target, the reference still reaches it at its budget (saving 0), never inf (which read
  every arm that reached it as a 100 % saving)."""
  rng, above = np.random.default_rng(0), 0
  for _ in range(100):
    rows = [dict(run=f"{a}_{s}", arm=a, **{"train.seed": s}, lr=1e-2, step=k,
                 tokens=(k + 1) * 1000.0 * (1 if a == "fixed" else 0.8), train_time_s=k + 1.0,
                 eval_loss=5 - 0.2 * k + rng.normal(0, 0.02), batch_size=32)
            for a in ("fixed", "ramp") for s in range(6) for k in range(5)]
    cur = pd.DataFrame(rows)
    fixed = cur[cur["arm"] == "fixed"]
    target = float(fixed.sort_values("tokens").groupby("run")["eval_loss"].last().mean())
    above += float(runs.seed_mean(fixed, ["eval_loss"])["eval_loss"].iloc[-1]) > target
    out = runs.seed_mean_to_target(cur, "fixed", target).set_index("arm")
    assert out.loc["fixed", "token_saving"] == 0.0
    assert out.loc["ramp", "token_saving"] < 0.5  # ~20 % fewer tokens, or not reached
  assert above > 0  # the float order did put the curve above its target in some draws
  never = pd.DataFrame([dict(run="f", arm="fixed", **{"train.seed": 1}, lr=1e-2, step=1,
                             tokens=1e3, train_time_s=1.0, eval_loss=4.0, batch_size=8)])
  assert np.isnan(runs.seed_mean_to_target(never, "fixed", 3.0)["token_saving"].iloc[0])


def test_an_open_ramp_vs_fixed_gets_seeds_on_both_arms_at_their_budget():
  """The ramp's pilot (run in the follow-up stage) and the fixed run's fresh seeds are the
  first look; open there, both arms get seeds up to the YAML's cap (`MoreSeeds`, the same
  mechanism as the preconditioner's), the ramp at its own steps and ramp tokens."""
  from pergrad.sweep import follow_up_blocks

  sw = gr.sweep("cpu")
  steps = int(sw.blocks[0].grid[gr.STEPS][0])
  ramp = gr.ramp_arm("cpu", LR, steps)
  noisy = (4.10, 3.95, 4.02, 3.93, 4.08, 3.99)  # ramp − fixed straddles 0: open
  rows = [{"batch.kind": "fixed", gr.STEPS: steps, "optimizer.lr": lr, "train.seed": 0,
           "final_eval_loss": 4.0 + abs(lr - LR), "status": "completed", "diverged": False}
          for lr in sw.blocks[0].grid["optimizer.lr"] + [LR]]
  rows += [{"batch.kind": "fixed", gr.STEPS: steps, "optimizer.lr": LR, "train.seed": s,
            "final_eval_loss": 4.0, "status": "completed", "diverged": False}
           for s in gr.SEEDS["cpu"]]
  fin = pd.DataFrame(rows, columns=[*rows[0], "batch.ramp_tokens"])
  blocks, kind = follow_up_blocks(sw, fin)  # before the follow-up stage: the ramp awaited
  assert kind == "pilot" and all(b.grid["batch.kind"] == ["fixed"] for b in blocks)
  fin = pd.concat([fin, pd.DataFrame([{**ramp, "train.seed": s, "final_eval_loss": v,
                                       "status": "completed", "diverged": False}
                                      for s, v in zip(gr.SEEDS["cpu"], noisy, strict=True)])])
  blocks, kind = follow_up_blocks(sw, fin)
  added = [b for b in blocks if min(b.grid["train.seed"]) > max(gr.SEEDS["cpu"])]
  assert kind == "seeds" and len(added) == 2
  want = list(range(7, 7 + gr.MOST_SEEDS - len(gr.SEEDS["cpu"])))
  assert all(b.grid["train.seed"] == want for b in added)
  ramp_block = next(b for b in added if b.grid["batch.kind"] == ["linear"])
  assert {k: v[0] for k, v in ramp_block.grid.items() if k != "train.seed"} == ramp


def test_the_fixed_runs_lr_grid_grows_past_its_edge_up_to_its_cap():
  """lr_search's growth (`follow_up_blocks`): the fixed B_max run's best lr at the grid's top
  adds the next lr (×2, at the first stage's budget), until MAX_EXTEND lrs past it, where the
  search stops and the report's `bracketed` guard reads it undetermined."""
  from pergrad.sweep import follow_up_blocks

  sw = gr.sweep("cpu")
  first = sw.blocks[0]
  steps = int(first.grid[gr.STEPS][0])
  row = lambda lr: {"batch.kind": "fixed", gr.STEPS: steps, "optimizer.lr": lr, "train.seed": 0,
                    "final_eval_loss": 5.0 - lr, "status": "completed", "diverged": False}
  grid = list(first.grid["optimizer.lr"])
  for _ in range(gr.MAX_EXTEND):
    blocks, kind = follow_up_blocks(sw, pd.DataFrame([row(x) for x in grid]))
    assert kind == "extend" and blocks[0].grid["optimizer.lr"] == [grid[-1] * 2]
    assert blocks[0].grid[gr.STEPS] == [steps] and blocks[0].grid["train.seed"] == [0]
    grid.append(grid[-1] * 2)
  blocks, kind = follow_up_blocks(sw, pd.DataFrame([row(x) for x in grid]))
  assert kind != "extend"  # the cap: its fresh seeds at the edge, the guard reads it
  assert all(b.grid["optimizer.lr"] == [grid[-1]] for b in blocks)
