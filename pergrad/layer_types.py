"""Layer types of parameter leaves, and layer selections: the one classifier (no JAX).

A leaf is named by its path, "block_0/attn/query/kernel". Its layer type is, first, the
user's rules (`StatsRequest.type_rules`), then the kind of the layer call that uses it
where that decides (`call_rules`: a norm layer's leaves are "norm", an embedding table's
"embedding", whatever their names; the statistics engine finds the calls by tracing the
model, `pergrad.stats.surgery.sites.leaf_rules`, the same rules for every backend), then
the first match of `TYPE_RULES` (fnmatch on the LOWER-CASED path): "norm", "unembedding",
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
import re
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


# The layer type of the leaves of a layer call of a kind (pergrad.stats.taps.KINDS), where
# the kind decides it (a dense layer's type depends on where it sits: names decide).
KIND_TYPES = {"norm": "norm", "embed": "embedding"}


def call_rules(kinds: dict[str, str], user: Sequence[tuple[str, str]] = ()
               ) -> tuple[tuple[str, str], ...]:
  """The rules of a model whose leaves {path: kind of the layer call using it} are known:
  `user` first, then each leaf of a norm or embedding call by its exact path, then
  `TYPE_RULES`."""
  exact = lambda path: re.sub(r"([*?\[])", r"[\1]", path)
  typed = tuple((exact(p), KIND_TYPES[k]) for p, k in kinds.items() if k in KIND_TYPES)
  return tuple(tuple(r) for r in user) + typed + TYPE_RULES


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
