"""A pytest plugin for the benchmarks: where a test's time goes (setup, call, teardown).

``benchmarks/suites.py`` loads it (``-p benchmarks.phases``) in one extra, untimed run of
each suite, with ``BENCH_PHASES`` naming a file; at the end it writes there, as JSON, the
mean wall time and the mean CPU time of the test's thread per test spent inside pytest's
``pytest_runtest_setup``, ``_call`` and ``_teardown`` hooks (reporting between them, and
other threads such as the sink's, are not counted).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Generator

import pytest

ENV = "BENCH_PHASES"
PHASES = ("setup", "call", "teardown")

_totals: dict[str, list[float]] = {phase: [0.0, 0.0, 0.0] for phase in PHASES}


def _timed(phase: str) -> Callable[[pytest.Item], Generator[None, object, object]]:
    @pytest.hookimpl(wrapper=True)
    def hook(item: pytest.Item) -> Generator[None, object, object]:
        wall, cpu = time.perf_counter(), time.thread_time()
        try:
            return (yield)
        finally:
            total = _totals[phase]
            total[0] += time.perf_counter() - wall
            total[1] += time.thread_time() - cpu
            total[2] += 1

    return hook


pytest_runtest_setup = _timed("setup")
pytest_runtest_call = _timed("call")
pytest_runtest_teardown = _timed("teardown")


def pytest_unconfigure(config: pytest.Config) -> None:
    path = os.environ.get(ENV)
    if not path:
        return
    means = {
        phase: {"wall_ms": wall / n * 1e3, "cpu_ms": cpu / n * 1e3, "tests": int(n)}
        for phase, (wall, cpu, n) in _totals.items()
        if n
    }
    with open(path, "w", encoding="utf-8") as out:
        json.dump(means, out)
