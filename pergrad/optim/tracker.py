"""A tracker: a diagnostic beside the optimizer, a pair of pure functions

    state = init(params),    state = update(state, grad_stats, hparams)

(`Tracker`; the built-in ones: `pergrad.optim.snr.track_snr`,
`pergrad.optim.noise_scale.track_gns`). It never touches the updates, and its state lives
in the train state beside the optimizer's (`pergrad.train.state.TrainState.snr`, `.gns`),
so turning a diagnostic on or off leaves the optimizer state (and its checkpoint)
unchanged. `hparams` are the numbers the optimizer state holds (`pergrad.optim.hparams`;
None outside a train step), which a tracker may read (`track_snr()`: the optimizer's b1).
A tracker that is off (`OFF`) has the empty state `optax.EmptyState()`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import optax


class Tracker(NamedTuple):
  """A diagnostic beside the optimizer: pure functions of its state (module docstring)."""

  init: Callable[[Any], Any]  # params -> state
  update: Callable[..., Any]  # (state, grad_stats, hparams=None) -> state


OFF = Tracker(init=lambda params: optax.EmptyState(),
              update=lambda state, stats, hparams=None: state)
