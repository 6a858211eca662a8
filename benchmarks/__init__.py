"""Benchmarks for pytest-mailbox: ``make bench`` (or ``python benchmarks/run.py --help``)."""
