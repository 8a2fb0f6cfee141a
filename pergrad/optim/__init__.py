"""Optax-style optimizers that consume per-example gradient statistics (`GradStats`).

    opt = build_optimizer(optimizer_config("sign", placement="ema"), ScheduleConfig(),
                          total_steps=N, batch_size=B)
    stats = <statistics engine>(params, batch, want=opt.request.want, ...)
    updates, opt_state = opt.tx.update(stats.mean, opt_state, params, grad_stats=stats,
                                       examples_seen=seen, batch_size=B)

Modules: `sign` (sign placements), `adam_family` (Adam / MicroAdam / MicroAdamVar /
MicroAdamMSQ / mix; this MicroAdam is the per-example Adam of Roulet & Agarwala, not
IST-DASLab's compression optimizer), `schedule` (warmup + cosine, batch-size scaling),
`dp_noise` (DP-SGD's noise link), `configs` (one config dataclass per optimizer and the
registry: how to add an optimizer), `builders` (the built-ins' directions), `build`
(config -> Optimizer: the chain), `types` (Direction, Optimizer), `hparams` (the numbers a
sweep varies, held in the optimizer state); beside the optimizer: `tracker` (the
trackers' interface), `snr` (the SNRs and `track_snr`), `noise_scale` (`track_gns`,
`gns_metrics`), `moments` (the Adam family's shares and eps_share), `diagnostics` (what
is logged of them, ratios of sums).
"""

from pergrad.optim.adam_family import (
    VARIANTS,
    ScaleByAdamFamilyState,
    scale_by_adam_family,
    second_moment_statistic,
)
from pergrad.optim.build import build_optimizer, scaled_hparams
from pergrad.optim.configs import (
    AdamConfig,
    AdamFamilyConfig,
    MomentumConfig,
    OptimizerConfig,
    SignConfig,
    optimizer_config,
    register,
)
from pergrad.optim.diagnostics import diagnostics
from pergrad.optim.moments import Moments
from pergrad.optim.noise_scale import GnsTrackerState, gns_metrics, track_gns
from pergrad.optim.schedule import ScaledHparams, ScheduleConfig, make_schedule, scale_hparams
from pergrad.optim.sign import PLACEMENTS, scale_by_sign_placement
from pergrad.optim.snr import SnrTrackerState, track_snr
from pergrad.optim.tracker import OFF, Tracker
from pergrad.optim.types import Direction, Optimizer

__all__ = [
    "OFF", "PLACEMENTS", "VARIANTS", "AdamConfig", "AdamFamilyConfig", "Direction",
    "GnsTrackerState", "Moments", "MomentumConfig", "Optimizer", "OptimizerConfig",
    "ScaleByAdamFamilyState", "ScaledHparams", "ScheduleConfig", "SignConfig", "SnrTrackerState",
    "Tracker", "build_optimizer", "optimizer_config", "register", "diagnostics", "gns_metrics",
    "make_schedule", "scale_by_adam_family", "scale_by_sign_placement", "scale_hparams",
    "scaled_hparams", "second_moment_statistic", "track_gns", "track_snr",
]
