"""The transformer: causality, per-example gradients under vmap, and learning."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from pergrad.loss import make_loss_fn
from pergrad.model import ModelSpec, Transformer, init_params

# Axes all differ: B=3, T=11, d_model=24, heads=2 (head 12), d_ff=40, vocab=37.
SPEC = dict(n_layers=2, d_model=24, n_heads=2, d_ff=40, vocab_size=37, seq_len=16)
B, T = 3, 11
_init = jax.jit(init_params, static_argnums=(0, 2))


def _tokens(key, b=B, t=T):
  return jax.random.randint(key, (b, t), 0, SPEC["vocab_size"], dtype=jnp.int32)


@pytest.mark.parametrize("positions,norm,tie", [
    ("learned", "layernorm", False), ("rope", "rmsnorm", True)])
def test_causality(positions, norm, tie):
  """Changing token t changes no logit before t (and does change logits at t)."""
  spec = ModelSpec(**SPEC, positions=positions, norm=norm, tie_embeddings=tie)
  apply = jax.jit(Transformer(spec).apply)
  params = _init(spec, jax.random.PRNGKey(0), T)
  toks = _tokens(jax.random.PRNGKey(1))
  base = apply({"params": params}, toks)
  assert base.shape == (B, T, spec.vocab_size)
  for t in (0, 4, T - 1):
    changed = toks.at[:, t].set((toks[:, t] + 5) % spec.vocab_size)
    out = apply({"params": params}, changed)
    np.testing.assert_array_equal(np.asarray(out[:, :t]), np.asarray(base[:, :t]))
    assert not np.allclose(out[:, t], base[:, t])


@pytest.mark.extended  # kept out of the 10-minute main suite (~15-30 s)
def test_vmap_grad_over_single_examples_matches_loop():
  """jax.vmap(jax.grad) of the single-example loss = a Python loop, on every leaf."""
  spec = ModelSpec(**{**SPEC, "n_layers": 1})
  model = Transformer(spec)
  params = _init(spec, jax.random.PRNGKey(2), T)
  toks = _tokens(jax.random.PRNGKey(3), t=T + 1)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  loss_fn = make_loss_fn(model)

  def single(p, x_T, y_T):  # unbatched: tokens_T
    logits_TxV = model.apply({"params": p}, x_T)
    return optax.softmax_cross_entropy_with_integer_labels(logits_TxV, y_T).mean()

  per_ex = jax.jit(jax.vmap(jax.grad(single), in_axes=(None, 0, 0)))(
      params, batch["inputs"], batch["targets"])
  grad_fn = jax.jit(jax.grad(lambda p, one: loss_fn(p, one).mean()))
  for b in range(B):
    g_b = grad_fn(params, {k: v[b:b + 1] for k, v in batch.items()})
    jax.tree.map(lambda pe, g, b=b: np.testing.assert_allclose(pe[b], g, rtol=2e-5, atol=2e-6),
                 per_ex, g_b)
  mean_grad = grad_fn(params, batch)
  jax.tree.map(lambda pe, g: np.testing.assert_allclose(pe.mean(0), g, rtol=2e-5, atol=2e-6),
               per_ex, mean_grad)


def test_overfits_a_fixed_batch():
  spec = ModelSpec(**SPEC, positions="rope")
  loss_fn = make_loss_fn(Transformer(spec))
  params = _init(spec, jax.random.PRNGKey(4), T)
  toks = _tokens(jax.random.PRNGKey(5), t=T + 1)
  batch = {"inputs": toks[:, :-1], "targets": toks[:, 1:]}
  tx = optax.adam(1e-2)
  state = tx.init(params)

  @jax.jit
  def step(p, s):
    loss, g = jax.value_and_grad(lambda q: loss_fn(q, batch).mean())(p)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

  losses = []
  for _ in range(80):
    params, state, loss = step(params, state)
    losses.append(float(loss))
  assert losses[0] > 0.8 * np.log(SPEC["vocab_size"])  # starts near chance
  assert losses[-1] < 0.2 * losses[0], losses[::10]


def test_sequence_longer_than_model_is_a_clear_error():
  spec = ModelSpec(**SPEC)
  with pytest.raises(ValueError, match="exceeds model.seq_len"):
    init_params(spec, jax.random.PRNGKey(0), SPEC["seq_len"] + 1)
