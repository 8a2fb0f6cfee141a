"""examples/: the same request (mean, sq, norms, clipped per example) on a Linen, an NNX
and a plain-JAX two-block transformer, by surgery."""

import importlib.util
from pathlib import Path

import jax
import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", [
    pytest.param("linen", marks=pytest.mark.extended),
    pytest.param("nnx", marks=pytest.mark.extended), "plain_jax"])
def test_example_runs_and_clips(name):
  spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  loss, stats = module.main()
  assert np.isfinite(float(loss)) and float(stats.count) == module.B
  norms = np.sqrt(np.asarray(stats.total_sq_norms))  # of the clipped gradients, C = 1
  assert norms.shape == (module.B,) and np.all(norms <= 1.0 + 1e-5) and np.all(norms > 0.5)
  assert all(np.isfinite(x).all() for x in jax.tree.leaves((stats.sum, stats.sum_sq)))
