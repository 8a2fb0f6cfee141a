"""One registry API for every extension point: statistics, backends, optimizers, experiments.

    STATISTICS = Registry("statistic", hint="add one with pergrad.stats.register")
    STATISTICS.register("sq", Statistic(...))           # ValueError if the name is taken
    STATISTICS.seal()                                    # what is there now is built in
    STATISTICS.get("sq"); STATISTICS.names(); "sq" in STATISTICS
    STATISTICS.unregister("mine")                        # a built-in one cannot be removed

A plugin module registers its entries at import time (`plugins=[module]` in a config,
`--plugin` for experiments); built-in entries cannot be replaced or removed.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
  """Named entries of one kind, in registration order (module docstring)."""

  def __init__(self, what: str, *, hint: str = "", reserved: tuple[str, ...] = ()):
    self.what, self.hint = what, hint
    self._entries: dict[str, T] = {}
    self._builtin: frozenset[str] = frozenset(reserved)  # names no plugin may take

  def register(self, name: str, entry: T, *, replace: bool = False) -> T:
    """Adds `entry` under `name`; ValueError if the name is taken (unless `replace`) or
    built in."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"a {self.what} needs a non-empty name, got {name!r}.")
    if name in self._builtin:
      raise ValueError(f"the built-in {self.what} {name!r} cannot be redefined; register "
                       "yours under another name.")
    if name in self._entries and not replace:
      raise ValueError(f"{self.what} {name!r} is already registered; pass replace=True to "
                       "redefine it.")
    self._entries[name] = entry
    return entry

  def unregister(self, name: str) -> None:
    """Removes a plugin's entry (no error if absent); ValueError for a built-in one."""
    if name in self._builtin:
      raise ValueError(f"the built-in {self.what} {name!r} cannot be unregistered.")
    self._entries.pop(name, None)

  def seal(self) -> None:
    """Marks every entry registered so far as built in."""
    self._builtin = self._builtin | frozenset(self._entries)

  def get(self, name: str) -> T:
    """The entry `name`; ValueError naming the registered ones if unknown."""
    try:
      return self._entries[name]
    except (KeyError, TypeError):
      hint = f" ({self.hint})" if self.hint else ""
      raise ValueError(f"unknown {self.what} {name!r}; registered: {self.names()}{hint}."
                       ) from None

  def names(self) -> tuple[str, ...]:
    return tuple(self._entries)

  def items(self):
    return self._entries.items()

  def __contains__(self, name: object) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)
