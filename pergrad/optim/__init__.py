"""Optax-style optimizers that consume per-example gradient statistics (`GradStats`).

    opt = build_optimizer(optimizer_config("sign", placement="ema"), ScheduleConfig(),
                          total_steps=N, batch_size=B)
    stats = <statistics engine>(params, batch, want=opt.request.want, ...)
    updates, opt_state = opt.tx.update(stats.mean, opt_state, params, grad_stats=stats)

Modules: `sign` (sign placements), `adam_family` (Adam / MicroAdam / MicroAdamVar /
MicroAdamMSQ / mix; this MicroAdam is the per-example Adam of Roulet & Agarwala, not
IST-DASLab's compression optimizer), `schedule` (warmup + cosine, batch-size scaling),
`diagnostics` (SNR and second-moment shares), `configs` (one config dataclass per
optimizer and the registry: how to add an optimizer), `build` (config -> Optimizer).
"""

from pergrad.optim.adam_family import (
    VARIANTS,
    ScaleByAdamFamilyState,
    scale_by_adam_family,
    second_moment_statistic,
)
from pergrad.optim.build import Direction, build_optimizer, scaled_hparams
from pergrad.optim.configs import (
    AdamConfig,
    AdamFamilyConfig,
    MomentumConfig,
    OptimizerConfig,
    SignConfig,
    optimizer_config,
    register,
)
from pergrad.optim.diagnostics import SnrTrackerState, diagnostics, track_snr
from pergrad.optim.schedule import ScaledHparams, ScheduleConfig, make_schedule, scale_hparams
from pergrad.optim.sign import PLACEMENTS, scale_by_sign_placement
from pergrad.optim.types import Optimizer

__all__ = [
    "PLACEMENTS", "VARIANTS", "AdamConfig", "AdamFamilyConfig", "Direction", "MomentumConfig",
    "Optimizer", "OptimizerConfig",
    "ScaleByAdamFamilyState", "ScaledHparams", "ScheduleConfig", "SignConfig", "SnrTrackerState",
    "build_optimizer", "optimizer_config", "register", "diagnostics", "make_schedule",
    "scale_by_adam_family", "scale_by_sign_placement", "scale_hparams", "scaled_hparams",
    "second_moment_statistic", "track_snr",
]
