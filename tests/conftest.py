"""Shared test setup."""

from __future__ import annotations

# Hypothesis' pytest plugin imports hypothesis lazily at the end of every session; pytester
# runs in-process and drops modules first imported inside a run, so each inner run would pay
# that import again (about 1.5 s). Importing it once here keeps it loaded.
import hypothesis.internal.observability  # noqa: F401
