"""Layer types of parameter leaves, and layer selections: the one classifier (no JAX).

A leaf is named by its path, "block_0/attn/query/kernel". Its layer type is the first
match of `TYPE_RULES` (fnmatch on the LOWER-CASED path): "norm", "unembedding",
"embedding", "attention", "mlp", else "other". The rules cover `pergrad.model.Transformer`,
the common GPT namings and Flax's default module names ("LayerNorm_0", "RMSNorm_0",
"Embed_0", "MultiHeadDotProductAttention_0"); a user passes their own rules where a
function takes `rules`. A selection is a tuple of layer types and/or fnmatch path
patterns (matched as written); the empty selection covers every leaf. `StatsRequest.layers`
carries one, and the gradient noise scale (`pergrad.stats.noise.groups_of`) groups leaves
by these types.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

LAYER_TYPES = ("norm", "unembedding", "embedding", "attention", "mlp", "other")
# (fnmatch pattern on the leaf path, layer type): the first match wins.
TYPE_RULES: tuple[tuple[str, str], ...] = (
    ("*norm*", "norm"), ("*ln_*", "norm"),
    ("*unembed*", "unembedding"), ("*lm_head*", "unembedding"),
    ("*embed*", "embedding"), ("*wte*", "embedding"), ("*wpe*", "embedding"),
    ("*attn*", "attention"), ("*attention*", "attention"),
    ("*mlp*", "mlp"), ("*ffn*", "mlp"),
)


def layer_type(path: str, rules: Sequence[tuple[str, str]] = TYPE_RULES) -> str:
  """The layer type of a leaf path (first rule matching the lower-cased path; "other")."""
  lowered = path.lower()
  for pattern, kind in rules:
    if fnmatch.fnmatchcase(lowered, pattern.lower()):
      return kind
  return "other"


def selects(layers: Sequence[str], path: str,
            rules: Sequence[tuple[str, str]] = TYPE_RULES) -> bool:
  """Whether the selection `layers` (types or fnmatch patterns; empty: all) covers `path`."""
  if not layers:
    return True
  kind = layer_type(path, rules)
  return any(sel == kind or fnmatch.fnmatchcase(path, sel) for sel in layers)


def check(layers: Sequence[str]) -> tuple[str, ...]:
  """The selection as a sorted tuple; ValueError on an empty or non-string entry."""
  layers = (layers,) if isinstance(layers, str) else tuple(layers)
  bad = [x for x in layers if not isinstance(x, str) or not x]
  if bad:
    raise ValueError(f"layers={list(layers)}: each entry is a layer type {LAYER_TYPES} or a "
                     "path pattern like 'block_*/attn/*'.")
  return tuple(sorted(set(layers)))
