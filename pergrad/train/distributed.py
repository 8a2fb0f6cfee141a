"""Multi-process JAX (one process per host or per GPU): start-up and who writes.

    initialize(coordinator_address, num_processes, process_id)   # before any JAX work

`jax.distributed.initialize` runs when the coordinator is given explicitly (`dist.*`
in the config), or, with `auto`, when the environment is a multi-task SLURM job or a
multi-host TPU slice (JAX then finds everything itself). After it, `jax.devices()` are
all processes' devices: the ('data',) mesh spans them, each process loads only its rows
of the global batch (`pergrad.data.LMData.train_batch(step, part)`), and only process
0 writes metrics, W&B, the summary and the figure; Orbax checkpoints are written by
every process together, as Orbax requires.

When not every process has joined within `timeout_s` (`dist.timeout_s`), the process
prints one line naming the coordinator and the process count and exits with status 1
(JAX itself would abort with a C++ stack trace, after its own timeout).
"""

from __future__ import annotations

import os
import sys
import threading

import jax


def cluster_environment() -> bool:
  """True inside a multi-task SLURM job or a multi-host Cloud TPU slice."""
  slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1 and "SLURM_JOB_ID" in os.environ
  tpu = len([h for h in os.environ.get("TPU_WORKER_HOSTNAMES", "").split(",") if h]) > 1
  return slurm or tpu


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = True,
               timeout_s: int = 300) -> bool:
  """Starts the multi-controller runtime if asked or detected; True when it did."""
  if coordinator_address:
    if num_processes is None or process_id is None:
      raise ValueError(
          "dist.coordinator_address needs dist.num_processes and dist.process_id too "
          "(e.g. dist.num_processes=2 dist.process_id=0 on the first process).")
    _within(timeout_s, f"the coordinator at {coordinator_address}", num_processes,
            dict(coordinator_address=coordinator_address, num_processes=num_processes,
                 process_id=process_id))
    return True
  if auto and cluster_environment():
    n = int(os.environ.get("SLURM_NTASKS") or
            len(os.environ["TPU_WORKER_HOSTNAMES"].split(",")))
    _within(timeout_s, "the coordinator JAX derives from the SLURM/TPU environment", n, {})
    return True
  return False


def _within(timeout_s: int, coordinator: str, n: int, kwargs: dict) -> None:
  """jax.distributed.initialize(**kwargs), or one line and exit 1 after `timeout_s`."""

  def give_up():
    sys.stdout.flush()
    print(f"error: not all {n} processes joined {coordinator} within dist.timeout_s="
          f"{timeout_s} s; start every process of the run (dist.process_id=0..{n - 1}, the "
          "same dist.coordinator_address) or raise dist.timeout_s.", file=sys.stderr,
          flush=True)
    os._exit(1)  # JAX's connect blocks in C++: nothing else can stop it

  timer = threading.Timer(timeout_s, give_up)
  timer.daemon = True
  timer.start()
  try:
    jax.distributed.initialize(**kwargs, initialization_timeout=timeout_s + 60)
  finally:
    timer.cancel()


def part() -> tuple[int, int]:
  """(this process's index, number of processes): which rows of a batch it loads."""
  return jax.process_index(), jax.process_count()


def is_main() -> bool:
  return jax.process_index() == 0
