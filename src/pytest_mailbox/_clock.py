"""The plugin's own clocks: the machine's, whatever a test does to its time.

A test may freeze or move time around the mail it waits for (freezegun, time-machine).
The store's times (``received_at``, ``expires_at``, ``lease_until``) are shared with the
sink's thread and with every xdist worker, and a wait's deadline must come: none of them
may follow the test's fake clock.

- freezegun replaces ``time.time``, ``time.monotonic`` and ``time.perf_counter`` in the
  ``time`` module and in every module that holds one (``from time import monotonic``):
  the real functions are kept here in a tuple, where its scan of module attributes does
  not look, and taken from ``freezegun.api`` if time was frozen when this was imported.
- time-machine patches the C functions themselves, so a kept ``time.time`` moves with it;
  its ``escape_hatch`` reads the real one. It leaves the monotonic clocks alone.
"""

from __future__ import annotations

import sys
import time
import types
from collections.abc import Callable

__all__ = ["faked", "monotonic", "perf_counter", "wall"]


def _real(name: str) -> Callable[[], float]:
    found: Callable[[], float] = getattr(time, name)
    if not isinstance(found, types.BuiltinFunctionType):  # freezegun's, freezing now
        found = getattr(sys.modules.get("freezegun.api"), f"real_{name}", found)
    return found


_REAL = (_real("time"), _real("monotonic"), _real("perf_counter"))


def wall() -> float:
    """Seconds since the epoch by the machine's clock: ``time.time()`` unfaked.

    A travel may start or end in another thread (the test's, while the sink's reads) between
    the look at it and the read: its escape hatch, asked after the travel ended, raises
    ``ValueError`` ("Not currently time-travelling."), and ``time.time`` read after one
    started is the travel's time. Either way the read is made again."""
    machine = sys.modules.get("time_machine")
    hatch = getattr(machine, "escape_hatch", None)
    if hatch is None:
        return _REAL[0]()
    while True:
        if hatch.is_travelling():
            try:
                return float(hatch.time.time())
            except ValueError:  # the travel ended since
                continue
        now = _REAL[0]()
        if not hatch.is_travelling():
            return now


def monotonic() -> float:
    """``time.monotonic()`` unfaked: deadlines and the sink's event loop."""
    return _REAL[1]()


def perf_counter() -> float:
    """``time.perf_counter()`` unfaked: how long a call took."""
    return _REAL[2]()


def faked() -> bool:
    """Whether freezegun replaced the clocks a test's event loop reads: asyncio's
    ``time.monotonic`` (unless ``real_asyncio=True``) and trio's ``time.perf_counter``
    (always). A sleep on that loop then never ends: see ``mailbox.async_sleep``."""
    return time.monotonic is not _REAL[1] or time.perf_counter is not _REAL[2]
