"""What an entry point sets for its whole process (`pergrad.train.cli.main`, scripts/), never a
library module: other libraries' log levels, and filters that drop the duplicate tracebacks of
a failed checkpoint read or write (Orbax's, asyncio's "exception was never retrieved", and
TensorStore's "Event loop is closed" from its threads), each failure being reported in one
line by `pergrad.train.checkpoint` already."""

from __future__ import annotations

import logging
import sys
import threading


def quiet() -> None:
  """Sets the process's logging and exception hooks as a training entry point wants them
  (idempotent)."""
  for name in ("absl", "jax"):  # Orbax logs every file at INFO; JAX its backend search
    logging.getLogger(name).setLevel(logging.WARNING)
  _add_filter("absl", _OrbaxTracebacks())
  _add_filter("asyncio", _NeverRetrieved())
  _drop_closed_loop_errors()


def _add_filter(logger: str, f: logging.Filter) -> None:
  lg = logging.getLogger(logger)
  if not any(isinstance(g, type(f)) for g in lg.filters):
    lg.addFilter(f)


class _OrbaxTracebacks(logging.Filter):
  """Drops Orbax's tracebacks of a failed background save (raised to the caller as well)."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not (record.exc_info and "orbax" in record.pathname)


class _NeverRetrieved(logging.Filter):
  """Drops asyncio's "exception was never retrieved" of a failed restore's reads (or a failed
  save's writes), logged whenever their futures are collected."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "exception was never retrieved" not in record.getMessage()


def _closed_loop(exc: BaseException | None) -> bool:
  return isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed"


def _drop_closed_loop_errors() -> None:
  """When a restore or save fails, TensorStore's operations still in flight call back into
  Orbax's closed asyncio loop from their threads, each printing a traceback of "Event loop is
  closed" (harmless: the failure is reported already). Those errors alone are dropped."""
  if getattr(sys.excepthook, "_pergrad", False):
    return
  excepthook, unraisable, thread_hook = sys.excepthook, sys.unraisablehook, threading.excepthook

  def on_exception(kind, value, tb):
    if not _closed_loop(value):
      excepthook(kind, value, tb)

  def on_unraisable(u):
    if not _closed_loop(u.exc_value):
      unraisable(u)

  def on_thread(args):
    if not _closed_loop(args.exc_value):
      thread_hook(args)

  on_exception._pergrad = True
  sys.excepthook, sys.unraisablehook, threading.excepthook = (on_exception, on_unraisable,
                                                             on_thread)
