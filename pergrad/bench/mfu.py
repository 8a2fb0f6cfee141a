"""Model FLOPs utilisation: achieved model FLOP/s over the device's peak.

Model FLOPs per token (the PaLM / nanoGPT convention, forward + backward, no
rematerialisation): 6·N + 12·L·T·d, with N all parameters, L layers, T the sequence
length and d the model width (the second term is attention's QKᵀ and AV). Per-example
statistics add work that is NOT counted: MFU says how much of the device the model's own
training FLOPs use, so statistics lower it (XLA's own count is reported beside it).

Peaks are dense bf16 tensor FLOP/s per device from the vendors' data sheets; pass
`peak_flops=` (scripts: `--peak-flops`) for another device or dtype. CPUs have no entry:
MFU is then None unless a peak is given.
"""

from __future__ import annotations

PEAK_BF16_FLOPS = {  # substring of jax's device_kind -> FLOP/s
    "H200": 989e12, "H100": 989e12, "A100": 312e12, "L4": 121e12, "V100": 125e12,
    "TPU v6": 918e12, "TPU v5p": 459e12, "TPU v5 lite": 197e12, "TPU v5e": 197e12,
    "TPU v4": 275e12,
}


def model_flops_per_token(n_params: int, n_layers: int, seq_len: int, d_model: int) -> float:
  return 6.0 * n_params + 12.0 * n_layers * seq_len * d_model


def peak_flops(device_kind: str, override: float | None = None) -> float | None:
  if override:
    return float(override)
  for key, flops in PEAK_BF16_FLOPS.items():
    if key.lower() in device_kind.lower():
      return flops
  return None


def mfu(tokens_per_s: float, flops_per_token: float, n_devices: int,
        peak: float | None) -> float | None:
  """Achieved model FLOP/s per device over the per-device peak (None without a peak)."""
  if not peak:
    return None
  return tokens_per_s * flops_per_token / n_devices / peak
