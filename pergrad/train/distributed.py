"""Multi-process JAX (one process per host or per GPU): start-up and who writes.

    initialize(coordinator_address, num_processes, process_id)   # before any JAX work

`jax.distributed.initialize` runs when the coordinator is given explicitly (`dist.*`
in the config), or, with `auto`, when the environment is a multi-task SLURM job or a
multi-host TPU slice (JAX then finds everything itself). After it, `jax.devices()` are
all processes' devices: the ('data',) mesh spans them, each process loads only its rows
of the global batch (`pergrad.data.LMData.train_batch(step, part)`), and only process
0 writes metrics, W&B, the summary and the figure; Orbax checkpoints are written by
every process together, as Orbax requires.
"""

from __future__ import annotations

import os

import jax


def cluster_environment() -> bool:
  """True inside a multi-task SLURM job or a multi-host Cloud TPU slice."""
  slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ
  tpu = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
  return slurm or tpu


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = True) -> bool:
  """Starts the multi-controller runtime if asked or detected; True when it did."""
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ValueError(
          "dist.coordinator_address needs dist.num_processes and dist.process_id too "
          "(e.g. dist.num_processes=2 dist.process_id=0 on the first process).")
    jax.distributed.initialize(coordinator_address=coordinator_address,
                               num_processes=num_processes, process_id=process_id)
    return True
  if auto and cluster_environment():
    jax.distributed.initialize()
    return True
  return False


def part() -> tuple[int, int]:
  """(this process's index, number of processes): which rows of a batch it loads."""
  return jax.process_index(), jax.process_count()


def is_main() -> bool:
  return jax.process_index() == 0
