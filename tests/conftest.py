"""Shared test setup."""

from __future__ import annotations

# Hypothesis' pytest plugin imports hypothesis lazily at the end of every session; pytester
# runs in-process and drops modules first imported inside a run, so each inner run would pay
# that import again (about 1.5 s). Importing it once here keeps it loaded.
import hypothesis.internal.observability  # noqa: F401
import pytest


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Inner runs without pytest-asyncio, which warns when its ini option is unset there."""
    run = pytester.runpytest

    def runpytest(*args: str | object, **kwargs: object) -> pytest.RunResult:
        return run("-p", "no:asyncio", *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pytester, "runpytest", runpytest)
    return pytester
