"""Per-example gradient statistics of a plain-JAX transformer, by surgery: the model calls
`pergrad.stats.taps` for its layers (plain computations outside the backend):
`python examples/plain_jax.py`."""

import jax
import jax.numpy as jnp

import pergrad.stats as ps
from pergrad.loss import per_example_xent
from pergrad.stats import taps

V, T, D, B, H = 64, 16, 32, 8, 2


def init(key):
  n = lambda k, *s: 0.02 * jax.random.normal(k, s)
  ks = iter(jax.random.split(key, 16))
  ln = lambda: {"scale": jnp.ones(D), "bias": jnp.zeros(D)}
  lin = lambda i, o: {"kernel": n(next(ks), i, o), "bias": jnp.zeros(o)}
  block = lambda: {"ln1": ln(), "qkv": lin(D, 3 * D), "out": lin(D, D), "ln2": ln(),
                   "up": lin(D, 4 * D), "down": lin(4 * D, D)}
  return {"embed": n(next(ks), V, D), "pos": n(next(ks), T, D), "blocks": [block(), block()],
          "norm": jnp.ones(D)}


def block(p, x):
  dense = lambda q, a: taps.dense(a, q["kernel"], q["bias"])
  h = taps.layer_norm(x, p["ln1"]["scale"], p["ln1"]["bias"])
  q, k, v = (a.reshape(*a.shape[:-1], H, D // H) for a in jnp.split(dense(p["qkv"], h), 3, -1))
  logits = jnp.einsum("bthd,bshd->bhts", q, k) / (D // H) ** 0.5
  att = jax.nn.softmax(jnp.where(jnp.tril(jnp.ones((T, T), bool)), logits, -1e9))
  x = x + dense(p["out"], jnp.einsum("bhts,bshd->bthd", att, v).reshape(x.shape))
  h = taps.layer_norm(x, p["ln2"]["scale"], p["ln2"]["bias"])
  return x + dense(p["down"], jax.nn.gelu(dense(p["up"], h)))


def lm(params, ids):
  x = taps.embed(ids, params["embed"]) + taps.embed(jnp.arange(T), params["pos"])
  for p in params["blocks"]:
    x = block(p, x)
  return taps.attend(taps.rms_norm(x, params["norm"]), params["embed"])  # tied output


def main():
  params = init(jax.random.key(0))
  ids = jax.random.randint(jax.random.key(1), (B, T + 1), 0, V)
  batch = {"inputs": ids[:, :-1], "targets": ids[:, 1:]}
  loss_fn = lambda p, b: per_example_xent(lm(p, b["inputs"]), b["targets"])
  request = ps.StatsRequest(want=("mean", "sq", "norms"), per_example_clip=1.0)
  compute = jax.jit(lambda p, b: ps.compute(loss_fn, p, b, request, backend="surgery"))
  return compute(params, batch)  # jitted: one compile, then as fast as a train step


if __name__ == "__main__":
  loss, stats = main()
  print(f"loss {loss:.3f}; per-example norms {stats.total_sq_norms ** 0.5}")
