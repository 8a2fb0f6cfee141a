"""`StatsRequest`: what one call of the statistics engine computes.

The single home of the rules about which requests make sense (whatever asks: an
optimizer, the logging plan, a user): valid statistic names, granularity, per-example
clipping only at example granularity, per-example norms only at example granularity.
Which backend can serve a valid request is decided by `api.resolve_backend`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from pergrad import layer_types as layers_lib
from pergrad.fields import Choice
from pergrad.stats import registry, types


class Granularity(Choice):
  """The samples a statistic is taken over: examples (n = B) or tokens (n = B·T)."""

  example = "example"
  token = "token"


@dataclasses.dataclass(frozen=True)
class StatsRequest:
  """Statistics of the samples of one batch.

  Attributes:
    want: statistic names (`pergrad.stats.STATISTICS`), sorted, always with "mean".
    granularity: "example" (samples g_b, n = B) or "token" (per-token contributions,
      n = B·T, surgery only).
    per_example_clip: clip each g_b to this global norm before every statistic
      (so "mean" is the mean of clipped gradients); None: no clipping.
    layers: the leaves whose statistics (other than "mean", always complete) are asked:
      layer types and/or path patterns (`pergrad.layer_types`); empty: every leaf.
      The surgery backend touches no other layer; the others compute every leaf and
      mark the selection (`GradStats.layers`).
  """

  want: tuple[str, ...] = ("mean",)
  granularity: str = "example"
  per_example_clip: float | None = None
  layers: tuple[str, ...] = ()

  def __post_init__(self):
    want = (self.want,) if isinstance(self.want, str) else tuple(self.want)
    known = types.STATISTICS
    unknown = [w for w in want if w not in known]
    if unknown:
      raise ValueError(
          f"unknown statistic(s) {unknown} in want={want}; valid statistics are {known} "
          "(variance, sign mean, etc. are derived from 'mean', 'sq', 'sign' by GradStats).")
    object.__setattr__(self, "want", tuple(s for s in known if s in set(want) | {"mean"}))
    object.__setattr__(self, "layers", layers_lib.check(self.layers))
    if self.granularity not in Granularity.values():
      raise ValueError(f"unknown granularity={self.granularity!r}; valid: "
                       f"{Granularity.values()}.")
    clip = self.per_example_clip
    if clip is not None and not clip > 0:
      raise ValueError(f"per_example_clip={clip} must be a positive norm (or null for none).")
    if clip is not None and self.granularity == "token":
      raise ValueError(
          "per_example_clip clips whole examples and cannot go with granularity='token' "
          "(e.g. the sign placement 'token'); set per_example_clip=null or use "
          "granularity='example'.")
    per_example = [w for w in self.want if w in registry.names("example")]
    if self.granularity == "token" and per_example:
      raise ValueError(
          f"{per_example} (per-example statistics, e.g. 'norms', the per-example squared "
          f"norms) exist only at granularity='example'; drop them from want or use "
          "granularity='example'.")

  @property
  def mean_only(self) -> bool:
    """True when plain `jax.value_and_grad` of the mean loss supplies the request."""
    return self.want == ("mean",) and self.granularity == "example" \
        and self.per_example_clip is None

  def union(self, want: Sequence[str], granularity: str,
            layers: Sequence[str] = ()) -> StatsRequest:
    """This request plus `want` at `granularity` for `layers`; ValueError if the
    granularities clash.

    A request for "mean" alone has no granularity or layers of its own: it takes the
    other's. Otherwise two different layer selections give every layer.
    """
    extra = tuple(dict.fromkeys(w for w in want if w != "mean"))
    layers = layers_lib.check(layers)
    if not extra:
      return self
    if self.want != ("mean",) and granularity != self.granularity:
      raise ValueError(
          f"the optimizer reads {self.granularity}-level statistics but {granularity}-level "
          f"statistics {list(extra)} are asked for logging; one backward pass computes one "
          f"granularity: set stats.granularity={self.granularity}.")
    if self.want == ("mean",):
      merged = layers
    else:
      merged = self.layers if self.layers == layers else ()
    return StatsRequest(want=self.want + extra, granularity=granularity,
                        per_example_clip=self.per_example_clip, layers=merged)
