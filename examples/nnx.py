"""Per-example gradient statistics of a Flax NNX transformer, by surgery (no edit to the
model: its Linear/Embed/LayerNorm/RMSNorm calls report while `compute` runs):
`python examples/nnx.py`."""

import jax
import jax.numpy as jnp
from flax import nnx

import pergrad.stats as ps
from pergrad.loss import per_example_xent

V, T, D, B = 64, 16, 32, 8


class Block(nnx.Module):
  def __init__(self, rngs):
    self.ln1, self.ln2 = nnx.LayerNorm(D, rngs=rngs), nnx.LayerNorm(D, rngs=rngs)
    self.att = nnx.MultiHeadAttention(2, D, decode=False, rngs=rngs)
    self.up, self.down = nnx.Linear(D, 4 * D, rngs=rngs), nnx.Linear(4 * D, D, rngs=rngs)

  def __call__(self, x):
    x = x + self.att(self.ln1(x), mask=nnx.make_causal_mask(x[..., 0]))
    return x + self.down(nnx.gelu(self.up(self.ln2(x))))


class LM(nnx.Module):
  def __init__(self, rngs):
    self.embed, self.pos = nnx.Embed(V, D, rngs=rngs), nnx.Embed(T, D, rngs=rngs)
    self.blocks = nnx.List([Block(rngs), Block(rngs)])
    self.norm = nnx.RMSNorm(D, rngs=rngs)

  def __call__(self, ids):
    x = self.embed(ids) + self.pos(jnp.arange(T))
    for block in self.blocks:
      x = block(x)
    return self.embed.attend(self.norm(x))  # tied output layer


def main():
  graphdef, params = nnx.split(LM(nnx.Rngs(0)), nnx.Param)  # the params pytree
  ids = jax.random.randint(jax.random.key(1), (B, T + 1), 0, V)
  batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
  loss_fn = lambda p, b: per_example_xent(nnx.merge(graphdef, p)(b["inputs"]), b["targets"])
  request = ps.StatsRequest(want=("mean", "sq", "norms"), per_example_clip=1.0)
  compute = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, request, backend="surgery"))
  return compute(params, batch)  # jitted: one compile, then as fast as a train step


if __name__ == "__main__":
  loss, stats = main()
  print(f"loss {loss:.3f}; per-example norms {stats.total_sq_norms ** 0.5}")
