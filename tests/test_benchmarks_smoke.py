"""The benchmark harness runs and writes a well-formed report.

Benchmarks are not tests: nothing here looks at a timing, only at the shape of the output.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from storekit import rows

ROOT = Path(__file__).resolve().parent.parent
CELL_SEPARATOR = re.compile(r"(?<!\\)\|")


def tables(markdown: str) -> list[list[str]]:
    """Every Markdown table: its consecutive lines that start with a pipe."""
    found: list[list[str]] = []
    current: list[str] = []
    for line in [*markdown.splitlines(), ""]:
        if line.startswith("|"):
            current.append(line)
        elif current:
            found.append(current)
            current = []
    return found


def benchmark_suites() -> types.ModuleType:
    """``benchmarks.suites``: a script directory, not an installed package."""
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks import suites  # noqa: PLC0415

        return suites
    finally:
        sys.path.remove(str(ROOT))


def smoke_run(tmp_path: Path, only: str) -> dict[str, Any]:
    """The results of ``run.py --smoke --only ONLY``, which must succeed."""
    raw = tmp_path / "results.json"
    argv = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--only", only]
    argv += ["--out", str(tmp_path / "performance.md"), "--json", str(raw)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results: dict[str, Any] = json.loads(raw.read_text(encoding="utf-8"))
    return results


def test_the_harness_writes_a_well_formed_report(tmp_path: Path) -> None:
    out, raw = tmp_path / "performance.md", tmp_path / "results.json"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "run.py"),
            "--smoke",
            "--only",
            "wakeup,claims",
            "--out",
            str(out),
            "--json",
            str(raw),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    results = json.loads(raw.read_text(encoding="utf-8"))
    assert results["errors"] == []
    assert results["plan"]["mode"] == "smoke"
    assert {"cores", "Python", "pytest-mailbox", "aiosmtpd"} <= set(results["machine"])
    assert {row["section"] for row in results["rows"]} == {"Wake-up", "Scale"}
    for row in results["rows"]:
        assert isinstance(row["value"], float)
        assert row["baseline"]
    assert [t["text"] for t in results["targets"]] == [
        "wake-up, own sink: p50 ≤ 2 ms",
        "wake-up, own sink: p99 ≤ 10 ms",
        "wake-up, another process's sink: p50 ≤ 10 ms",
        "claim latency at 100 stored ≤ 1.5× empty store",
    ]
    assert all(t["met"] in (True, False) for t in results["targets"])

    # The printed table and the Markdown file carry the same targets.
    assert "target" in done.stdout
    assert "claim latency at 100 stored" in done.stdout
    text = out.read_text(encoding="utf-8")
    assert text.startswith("# Performance")
    assert text.count("<!-- bench:begin -->") == text.count("<!-- bench:end -->") == 1
    found = tables(text)
    assert len(found) == 4  # machine, targets, wake-up, scale
    for table in found:
        widths = {len(CELL_SEPARATOR.split(line)) for line in table}
        assert len(widths) == 1, table
        assert set(table[1].replace("|", "")) == {"-"}
    assert all(("met" in line or "missed" in line) for line in found[1][2:])


def test_a_rerun_keeps_what_people_wrote_around_the_generated_part(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT))
    try:
        from benchmarks.run import BEGIN, END, write  # noqa: PLC0415 - not an installed package
    finally:
        sys.path.remove(str(ROOT))
    out = tmp_path / "performance.md"
    write(out, f"{BEGIN}\nfirst\n{END}")
    out.write_text(out.read_text(encoding="utf-8") + "\n## Fixes\n\nkept\n", encoding="utf-8")
    write(out, f"{BEGIN}\nsecond\n{END}")
    text = out.read_text(encoding="utf-8")
    assert "second" in text
    assert "first" not in text
    assert text.endswith("## Fixes\n\nkept\n")


def test_the_warm_up_caches_the_bytecode_of_the_modules_a_test_imports(tmp_path: Path) -> None:
    """The timed runs write no bytecode, so whatever the warm-up did not import is compiled
    again in every run: the plugin imports its sink, store and mailbox at the first test."""
    suites = benchmark_suites()
    cache = ROOT / "src" / "pytest_mailbox" / "__pycache__"
    lazy = ("mailbox", "message", "sink", "store")
    tag = f"{sys.implementation.cache_tag}-pytest-{pytest.__version__}.pyc"
    for name in lazy:
        (cache / f"{name}.{tag}").unlink(missing_ok=True)
    suites.precompile(tmp_path)
    assert all((cache / f"{name}.{tag}").exists() for name in lazy)


def test_the_xdist_rows_count_the_cpu_of_every_process(tmp_path: Path) -> None:
    """The `-n 2` figure comes with the CPU its processes used, workers included, and the
    speed-up that CPU would allow on every core: what bounds the figure on this machine."""
    suites = benchmark_suites()
    path = suites.generate(tmp_path, "mailbox", 4)
    alone = suites.run(path, "mailbox", 4)
    spread = suites.run(path, "mailbox", 4, workers=2)
    assert alone.cpu > 0
    # Two workers each import pytest-mailbox and start a sink, beside the controller: about
    # three times one process doing it all. The controller alone uses less than that one.
    assert spread.cpu > 1.5 * alone.cpu

    results = smoke_run(tmp_path, "xdist")
    details = [row["detail"] for row in results["rows"] if "`-n 2`" in row["name"]]
    assert len(details) == 2
    assert all(re.search(r"CPU \(user \+ system, all processes\) \d+\.\d\d s", d) for d in details)
    assert all(re.search(r"cores busy throughout: \d+\.\d\d×", d) for d in details)
    (target,) = results["targets"]
    assert re.search(r"cores busy throughout: \d+\.\d\d× \(bare \d+\.\d\d×\)", target["note"])


def test_the_floor_suite_makes_the_five_durable_writes_and_the_report_sets_it_beside(
    tmp_path: Path,
) -> None:
    """The floor suite reserves, delivers, claims, acks and releases each test's mail in the
    store (so it measures those writes), and the suites' report sets it beside the target."""
    suites = benchmark_suites()
    path = suites.generate(tmp_path, "floor", 3)
    suites.run(path, "floor", 3)  # raises unless every test passed
    db = path / "basetemp" / "floor0" / "store.sqlite3"
    boxes = rows(db, "SELECT state, count(*) FROM boxes GROUP BY state")
    mails = rows(db, "SELECT state, count(*) FROM mails GROUP BY state")
    assert (boxes, mails) == ([("released", 3)], [("consumed", 3)])

    results = smoke_run(tmp_path, "suites")
    names = [row["name"] for row in results["rows"]]
    assert sum("the contract's floor" in name for name in names) == 2  # wall, and phases
    target = next(t for t in results["targets"] if "≤ 1.2× bare list sink" in t["text"])
    floor = r"the floor \(five durable writes and a pydantic contract, nothing else\): \d+\.\d\d×"
    assert re.search(floor, target["note"])
    # A test's store work alone, beside the floor's, step by step; and its share in the note.
    alone = [row for row in results["rows"] if "a test's store work alone" in row["name"]]
    assert [row["baseline"] for row in alone] == ["the floor's five writes"] * 2
    floor_steps = r"reserve \d+; deliver \d+; claim \+ ack \d+; release \d+$"
    assert re.search(floor_steps, alone[0]["detail"])
    steps = r"reserve \d+; deliver \d+; wait_for \(claim\) \d+; ack \d+; close \+ receipt \d+$"
    assert re.search(steps, alone[1]["detail"])
    assert alone[0]["ratio"] == 1.0
    store_work = r"store work alone: [+-]\d+\.\d\d ms of CPU per test over the floor's"
    assert re.search(store_work, target["note"])
