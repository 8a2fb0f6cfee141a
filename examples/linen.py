"""Per-example gradient statistics of a Flax Linen transformer, by surgery (no edit to
the model): `python examples/linen.py`."""

import flax.linen as nn
import jax
import jax.numpy as jnp

import pergrad.stats as ps
from pergrad.loss import per_example_xent

V, T, D, B = 64, 16, 32, 8


class Block(nn.Module):
  @nn.compact
  def __call__(self, x):
    h = nn.LayerNorm()(x)
    att = nn.MultiHeadDotProductAttention(num_heads=2)(h, mask=nn.make_causal_mask(x[..., 0]))
    x = x + att
    return x + nn.Dense(D)(nn.gelu(nn.Dense(4 * D)(nn.LayerNorm()(x))))


class LM(nn.Module):
  @nn.compact
  def __call__(self, ids):
    embed = nn.Embed(V, D)
    x = embed(ids) + nn.Embed(T, D)(jnp.arange(T))
    x = Block()(Block()(x))
    return embed.attend(nn.RMSNorm()(x))  # tied output layer


def main():
  model = LM()
  params = model.init(jax.random.key(0), jnp.zeros((1, T), jnp.int32))["params"]
  ids = jax.random.randint(jax.random.key(1), (B, T + 1), 0, V)
  batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
  loss_fn = lambda p, b: per_example_xent(model.apply({"params": p}, b["inputs"]), b["targets"])
  request = ps.StatsRequest(want=("mean", "sq", "norms"), per_example_clip=1.0)
  compute = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, request, backend="surgery"))
  return compute(params, batch)  # jitted: one compile, then as fast as a train step


if __name__ == "__main__":
  loss, stats = main()
  print(f"loss {loss:.3f}; per-example norms {stats.total_sq_norms ** 0.5}")
