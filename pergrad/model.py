"""A pre-norm decoder-only transformer built only from standard Flax layers.

The model knows nothing of gradient statistics: it is made of `nn.Embed`,
`nn.DenseGeneral`/`nn.Dense` and `nn.LayerNorm`/`nn.RMSNorm`, so the surgery
backend of `pergrad.stats` can attach to it from outside (`nn.intercept_methods`).

    logits_BxTxV = Transformer(cfg).apply({"params": params}, tokens_BxT)

`apply` is a pure function of (params, tokens) and works on a single example
under `jax.vmap`, which the vmap statistics backend relies on. With
`ModelSpec.scan_layers` the blocks are one `nn.scan` over stacked parameters
params["blocks"][...] of shape [L, ...] (block l's leaf is the slice l; `stack_blocks`
converts an unscanned tree), each block under `nn.remat` (dots saveable).
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from pergrad.fields import Choice, positive

# The parameter leaf of the token embedding table (shared with the unembedding when
# ModelSpec.tie_embeddings): the GNS tracker's `tied_leaf` (`track_gns`).
TIED_EMBEDDING = "embed/embedding"


class Norm(Choice):
  layernorm = "layernorm"
  rmsnorm = "rmsnorm"


class Positions(Choice):
  learned = "learned"
  rope = "rope"


@dataclasses.dataclass(unsafe_hash=True)
class ModelSpec:
  """Model hyper-parameters (the `model` config node); checked on construction.

  A plain dataclass (Hydra merges into it), hashed by value: a spec is a static argument
  (`jax.jit(init_params, static_argnums=0)`) and a Flax module attribute, so it is not
  changed once built."""

  name: str = "tiny"  # the preset's name (configs/model/<name>.yaml), a label only
  n_layers: int = 2  # transformer blocks
  d_model: int = 128  # residual width
  n_heads: int = 4  # attention heads (dividing d_model)
  d_ff: int = 512  # MLP hidden width
  vocab_size: int = 1024  # must equal the tokenizer's vocabulary (checked at start-up)
  seq_len: int = 128  # longest sequence the model supports (size of learned positions)
  norm: Norm = Norm.layernorm  # normalization layers
  positions: Positions = Positions.learned  # learned position embeddings or rotary
  tie_embeddings: bool = False  # the unembedding is the embedding table, transposed
  use_bias: bool = False  # biases in dense and normalization layers
  param_dtype: str = "float32"  # dtype of the parameters
  compute_dtype: str = "float32"  # "bfloat16" for mixed precision
  scan_layers: bool = False  # blocks as one nn.scan (stacked params [L, ...]) under remat

  def __post_init__(self):
    self.norm = Norm.check(self.norm, "model.norm")
    self.positions = Positions.check(self.positions, "model.positions")
    positive(self, "model", "n_layers", "d_model", "n_heads", "d_ff", "vocab_size", "seq_len")
    if self.d_model % self.n_heads:
      raise ValueError(
          f"model.d_model={self.d_model} is not divisible by model.n_heads={self.n_heads}; "
          "choose n_heads dividing d_model."
      )
    if self.positions == "rope" and (self.d_model // self.n_heads) % 2:
      raise ValueError(
          f"rotary positions need an even head size, got d_model/n_heads="
          f"{self.d_model // self.n_heads}; change model.d_model or model.n_heads."
      )

  @property
  def head_dim(self) -> int:
    return self.d_model // self.n_heads


def _norm(spec: ModelSpec, name: str) -> nn.Module:
  dtype = jnp.dtype(spec.compute_dtype)
  if spec.norm == "rmsnorm":
    return nn.RMSNorm(dtype=dtype, param_dtype=jnp.dtype(spec.param_dtype), name=name)
  return nn.LayerNorm(dtype=dtype, param_dtype=jnp.dtype(spec.param_dtype), name=name)


def rotary(x_BxTxHxK: jax.Array, base: float = 10_000.0) -> jax.Array:
  """Rotary position embedding (Su et al. 2021) on the last axis, halves convention."""
  T, K = x_BxTxHxK.shape[-3], x_BxTxHxK.shape[-1]
  inv_freq_K2 = 1.0 / (base ** (jnp.arange(0, K, 2, dtype=jnp.float32) / K))
  angles_TxK2 = jnp.arange(T, dtype=jnp.float32)[:, None] * inv_freq_K2[None, :]
  sin, cos = jnp.sin(angles_TxK2)[:, None, :], jnp.cos(angles_TxK2)[:, None, :]
  x1, x2 = jnp.split(x_BxTxHxK.astype(jnp.float32), 2, axis=-1)
  out = jnp.concatenate([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
  return out.astype(x_BxTxHxK.dtype)


class Attention(nn.Module):
  """Causal multi-head self-attention."""

  spec: ModelSpec

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    s = self.spec
    dense = lambda name, **kw: nn.DenseGeneral(
        use_bias=s.use_bias,
        dtype=jnp.dtype(s.compute_dtype),
        param_dtype=jnp.dtype(s.param_dtype),
        kernel_init=nn.initializers.normal(stddev=s.d_model**-0.5),
        name=name,
        **kw,
    )
    q_BxTxHxK = dense("query", features=(s.n_heads, s.head_dim))(x_BxTxD)
    k_BxTxHxK = dense("key", features=(s.n_heads, s.head_dim))(x_BxTxD)
    v_BxTxHxK = dense("value", features=(s.n_heads, s.head_dim))(x_BxTxD)
    if s.positions == "rope":
      q_BxTxHxK, k_BxTxHxK = rotary(q_BxTxHxK), rotary(k_BxTxHxK)
    T = x_BxTxD.shape[-2]
    logits_BxHxTxT = jnp.einsum("...thk,...shk->...hts", q_BxTxHxK, k_BxTxHxK)
    logits_BxHxTxT = logits_BxHxTxT.astype(jnp.float32) * s.head_dim**-0.5
    causal_TxT = jnp.tril(jnp.ones((T, T), dtype=bool))
    logits_BxHxTxT = jnp.where(causal_TxT, logits_BxHxTxT, jnp.finfo(jnp.float32).min)
    probs_BxHxTxT = jax.nn.softmax(logits_BxHxTxT, axis=-1).astype(v_BxTxHxK.dtype)
    out_BxTxHxK = jnp.einsum("...hts,...shk->...thk", probs_BxHxTxT, v_BxTxHxK)
    return dense("out", features=s.d_model, axis=(-2, -1))(out_BxTxHxK)


class Mlp(nn.Module):
  spec: ModelSpec

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    s = self.spec
    kw = dict(use_bias=s.use_bias, dtype=jnp.dtype(s.compute_dtype),
              param_dtype=jnp.dtype(s.param_dtype))
    h_BxTxF = nn.Dense(s.d_ff, name="fc_in", **kw)(x_BxTxD)
    h_BxTxF = nn.gelu(h_BxTxF)
    return nn.Dense(s.d_model, name="fc_out", **kw)(h_BxTxF)


class Block(nn.Module):
  spec: ModelSpec

  @nn.compact
  def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
    x_BxTxD = x_BxTxD + Attention(self.spec, name="attn")(_norm(self.spec, "norm_attn")(x_BxTxD))
    x_BxTxD = x_BxTxD + Mlp(self.spec, name="mlp")(_norm(self.spec, "norm_mlp")(x_BxTxD))
    return x_BxTxD


SCANNED_BLOCKS = "blocks"  # the stacked blocks' subtree when ModelSpec.scan_layers


def _scanned_blocks(s: ModelSpec, x_BxTxD: jax.Array) -> jax.Array:
  """x <- block_l(x) for l < L as one `nn.scan` over params stacked on a leading [L] axis,
  each block rematerialized in the backward pass except its matmul outputs."""
  block = nn.remat(Block, policy=jax.checkpoint_policies.dots_saveable, prevent_cse=False)
  body = lambda mdl, x, _: (mdl(x), None)
  scan = nn.scan(body, variable_axes={"params": 0}, split_rngs={"params": True},
                 length=s.n_layers)
  return scan(block(s, name=SCANNED_BLOCKS), x_BxTxD, None)[0]


class Transformer(nn.Module):
  """tokens_BxT (int32) -> logits_BxTxV (float32). Works unbatched too (tokens_T)."""

  spec: ModelSpec

  @nn.compact
  def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
    s = self.spec
    T = tokens_BxT.shape[-1]
    if T > s.seq_len:
      raise ValueError(
          f"sequence length {T} exceeds model.seq_len={s.seq_len}; "
          "lower data.seq_len or raise model.seq_len."
      )
    embed = nn.Embed(
        s.vocab_size, s.d_model, dtype=jnp.dtype(s.compute_dtype),
        param_dtype=jnp.dtype(s.param_dtype),
        embedding_init=nn.initializers.normal(stddev=1.0), name="embed",
    )
    x_BxTxD = embed(tokens_BxT)
    if s.positions == "learned":
      pos = nn.Embed(
          s.seq_len, s.d_model, dtype=jnp.dtype(s.compute_dtype),
          param_dtype=jnp.dtype(s.param_dtype),
          embedding_init=nn.initializers.normal(stddev=0.02), name="pos_embed",
      )
      x_BxTxD = x_BxTxD + pos(jnp.arange(T))
    if s.scan_layers:
      x_BxTxD = _scanned_blocks(s, x_BxTxD)
    else:
      for i in range(s.n_layers):
        x_BxTxD = Block(s, name=f"block_{i}")(x_BxTxD)
    x_BxTxD = _norm(s, "norm_final")(x_BxTxD)
    if s.tie_embeddings:
      logits_BxTxV = embed.attend(x_BxTxD) * s.d_model**-0.5
    else:
      logits_BxTxV = nn.Dense(
          s.vocab_size, use_bias=False, dtype=jnp.dtype(s.compute_dtype),
          param_dtype=jnp.dtype(s.param_dtype), name="unembed",
      )(x_BxTxD)
    return logits_BxTxV.astype(jnp.float32)


def init_params(spec: ModelSpec, rng: jax.Array, seq_len: int | None = None):
  """Parameters of `Transformer(spec)` (a pure function of the key)."""
  tokens = jnp.zeros((1, seq_len or spec.seq_len), jnp.int32)
  return Transformer(spec).init(rng, tokens)["params"]


def stack_blocks(params, n_layers: int):
  """An unscanned tree {block_0..block_{L-1}, ...} -> the scanned model's tree, whose
  params["blocks"] leaf is stack_l(params["block_l"] leaf) (leading axis [L])."""
  blocks = [params[f"block_{i}"] for i in range(n_layers)]
  rest = {k: v for k, v in params.items() if not k.startswith("block_")}
  return {**rest, SCANNED_BLOCKS: jax.tree.map(lambda *x: jnp.stack(x), *blocks)}


def count_params(params) -> int:
  return sum(x.size for x in jax.tree.leaves(params))
