"""JAX's persistent compilation cache: each program compiled once per machine.

    with using(plan.train.compile_cache):   # "~/.cache/pergrad/jax" (default); None: off
      before = counts(); ...; counts() - before   # Counts(hits, misses, seconds) since

A run's train step reads the optimizer's numbers from its state (`pergrad.optim.hparams`),
so every point of an lr grid and every seed of a sweep is the same program; JAX's
persistent cache (keyed by the program, its compile options and the backend, never by
the numbers) serves it to every run after the first, in any process, and so do the init
and the eval step. Programs that compile in under `MIN_COMPILE_S` are not written.
`train.compile_cache=null` turns it off; JAX's own setting wins (the environment's
JAX_COMPILATION_CACHE_DIR, `jax.config`), and JAX's settings are restored after the run.
The default directory (`~/.cache/pergrad/jax`) gives way to the environment's
PERGRAD_COMPILE_CACHE (the test suite points it at a temporary directory); a directory set
in the config is used as set.
The cache is trusted code: keep its directory your own (JAX's warning). The run's summary
counts the programs the cache served (`compile_cache_hits`), those compiled that the cache
keeps (`compile_misses`: at least MIN_COMPILE_S) and the seconds compiling or reading
them (`compile_s`).
"""

from __future__ import annotations

import contextlib
import os
import threading
from pathlib import Path
from typing import NamedTuple

import jax
from jax.experimental.compilation_cache import compilation_cache

from pergrad import files
from pergrad.config.schema import DEFAULT_COMPILE_CACHE

MIN_COMPILE_S = 0.1  # JAX's default, 1 s, would leave out the eval step (under 1 s on CPU)
_lock = threading.Lock()
_seen = {"hits": 0, "misses": 0, "seconds": 0.0, "hit": False}
_state = {"listening": False}


class Counts(NamedTuple):
  hits: int  # programs the persistent cache served
  misses: int  # programs compiled that took at least MIN_COMPILE_S (the cache's to keep)
  seconds: float  # spent compiling or reading compiled programs

  def __sub__(self, other: Counts) -> Counts:
    return Counts(self.hits - other.hits, self.misses - other.misses,
                  self.seconds - other.seconds)


def _event(event: str, **kwargs) -> None:
  del kwargs
  with _lock:
    if event == "/jax/compilation_cache/compile_requests_use_cache":
      _seen["hit"] = False
    elif event == "/jax/compilation_cache/cache_hits":
      _seen["hit"] = True


def _duration(event: str, seconds: float, **kwargs) -> None:
  del kwargs
  if event == "/jax/core/compile/backend_compile_duration":  # after the cache's answer
    with _lock:
      _seen["seconds"] += seconds
      if _seen["hit"]:
        _seen["hits"] += 1
      elif seconds >= MIN_COMPILE_S:
        _seen["misses"] += 1
      _seen["hit"] = False


def counts() -> Counts:
  """Compiled programs of this process so far (counted from the first `use`)."""
  with _lock:
    return Counts(_seen["hits"], _seen["misses"], _seen["seconds"])


def _listen() -> None:
  if not _state["listening"]:
    jax.monitoring.register_event_listener(_event)
    jax.monitoring.register_event_duration_secs_listener(_duration)
    _state["listening"] = True


def check(directory: str | None) -> Path | None:
  """The folder `using(directory)` would cache in (None: JAX's own setting, or off);
  ValueError (one line naming train.compile_cache) when it cannot be used or created."""
  if jax.config.jax_compilation_cache_dir or not directory:
    return None
  if directory == DEFAULT_COMPILE_CACHE:
    directory = os.environ.get("PERGRAD_COMPILE_CACHE") or directory
  path = Path(directory).expanduser().resolve()
  why = files.not_creatable(path)
  if why:
    raise ValueError(_unusable(directory, path, why))
  return path


def _unusable(directory: str, path: Path, why: str) -> str:
  return (f"train.compile_cache={directory}: cannot keep the compilation cache in {path} "
          f"({why}); set train.compile_cache to a writable folder, or to null for none.")


@contextlib.contextmanager
def using(directory: str | None):
  """JAX's persistent compilation cache in `directory` (created; `~` expanded) while the
  block runs, JAX's settings as they were after it; yields the directory in use. JAX's
  own setting (JAX_COMPILATION_CACHE_DIR, `jax.config`) wins, as does None (left as is)."""
  _listen()
  own = jax.config.jax_compilation_cache_dir
  if own or not directory:
    yield Path(own) if own else None
    return
  path = check(directory)
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError as e:
    raise ValueError(_unusable(directory, path, e.strerror or type(e).__name__)) from None
  old = {k: getattr(jax.config, k) for k in ("jax_persistent_cache_min_compile_time_secs",
                                             "jax_enable_compilation_cache")}
  jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  jax.config.update("jax_enable_compilation_cache", True)
  compilation_cache.set_cache_dir(str(path))
  compilation_cache.reset_cache()  # JAX opens its cache once, at the next compile
  try:
    yield path
  finally:
    jax.config.update("jax_compilation_cache_dir", None)
    for k, v in old.items():
      jax.config.update(k, v)
    compilation_cache.reset_cache()
