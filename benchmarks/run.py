"""Run every benchmark, print one table, write ``docs/performance.md``.

    python benchmarks/run.py            # the full run (make bench)
    python benchmarks/run.py --quick    # under a minute: smaller counts, one round
    python benchmarks/run.py --only ingest,wakeup --out /tmp/perf.md

Each figure is set beside a baseline measured in the same run, as a ratio: on a shared,
noisy machine a ratio says more than an absolute number. Everything talks real SMTP on
127.0.0.1, and every loop is bounded by a count.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.metadata
import importlib.util
import json
import math
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import phases, suites
from benchmarks.clients import role_command

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = ROOT / "docs" / "performance.md"
BEGIN, END = "<!-- bench:begin -->", "<!-- bench:end -->"
BENCHMARKS = ("ingest", "wakeup", "claims", "rss", "suites", "xdist")
#: The cores this process may run on (its affinity), which its suites' runs inherit.
CORES = len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class Plan:
    """How much of everything a mode measures."""

    mode: str
    ingest: int  # timed mails per ingest round
    rounds: int  # rounds of ingest and of every suite, interleaved
    wakeup: int  # mails per wake-up case
    stored: tuple[int, ...]  # messages already in the store for claim latency
    claims: int  # claim samples per store size
    rss: int  # mails ingested for the RSS figure
    tests: int  # tests in the generated suite
    sequence: int  # tests' store sequences per round, timed in one thread


PLANS = {
    "full": Plan("full", 5_000, 3, 1_000, (0, 10_000, 100_000), 300, 100_000, 1_000, 2_000),
    "quick": Plan("quick", 300, 1, 200, (0, 10_000), 40, 600, 50, 300),
    "smoke": Plan("smoke", 30, 1, 5, (0, 100), 3, 50, 2, 5),
}


@dataclass
class Row:
    """One measured figure, with the baseline it is compared to in this run."""

    section: str
    name: str
    unit: str
    value: float
    p99: float | None = None
    ratio: float | None = None
    baseline: str = ""
    detail: str = ""


@dataclass
class Target:
    """One target of issue 7: what was asked, what was measured, met or not."""

    text: str
    measured: str
    met: bool | None  # None: not measured in this run
    note: str = ""


@dataclass
class Results:
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# -- statistics ------------------------------------------------------------------------


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (nearest rank) of ``values``."""
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values)


def ratio(value: float, base: float) -> float | None:
    return value / base if base else None


# -- processes -------------------------------------------------------------------------


def role_json(role: str, *args: object, timeout: float = 1800) -> dict[str, Any]:
    """Run a role to completion; its last stdout line is its JSON answer."""
    done = subprocess.run(
        role_command(role, *args), capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        msg = f"the {role} process failed ({done.returncode}):\n{done.stderr[-3000:]}"
        raise RuntimeError(msg)
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@contextlib.contextmanager
def server(kind: str, store: Path, mailboxes: int) -> Iterator[tuple[dict[str, Any], list[Any]]]:
    """A sink in its own process; yields (its ready line, a list that receives its final
    report once the block ends and the server has stopped)."""
    proc = subprocess.Popen(
        role_command("server", "--kind", kind, "--store", store, "--mailboxes", mailboxes),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    report: list[Any] = []
    try:
        ready = json.loads(proc.stdout.readline() or "null")
        if ready is None:
            msg = f"the {kind} server did not start"
            raise RuntimeError(msg)
        yield ready, report
        proc.stdin.close()
        report.append(json.loads(proc.stdout.readline()))
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


# -- benchmarks ------------------------------------------------------------------------

KINDS = {"bare": "bare aiosmtpd, list append", "mailbox": "pytest-mailbox MailSink + store"}


def bench_ingest(plan: Plan, tmp: Path, out: Results) -> None:
    """Mails per second from a client process: one connection reused, and eight."""
    bare_cpu: dict[int, float] = {}
    for conns in (1, 8):
        rates: dict[str, list[float]] = {"bare": [], "mailbox": []}
        rtts: dict[str, list[float]] = {"bare": [], "mailbox": []}
        cpu: dict[str, list[float]] = {"bare": [], "mailbox": []}
        for r in range(plan.rounds):
            for kind in ("bare", "mailbox"):
                store = tmp / f"ingest-{conns}-{kind}-{r}.sqlite3"
                with server(kind, store, conns) as (ready, report):
                    sent = role_json(
                        "blast",
                        "--port",
                        ready["port"],
                        "--rcpts",
                        ",".join(ready["addresses"]),
                        "--count",
                        plan.ingest,
                    )
                expected = plan.ingest + 20 * conns
                if report[0]["received"] != expected:
                    msg = f"{kind} received {report[0]['received']} of {expected} mails"
                    raise RuntimeError(msg)
                rates[kind].append(sent["count"] / sent["elapsed"])
                rtts[kind].extend(sent["rtts"])
                cpu[kind].append((report[0]["cpu_s"] - ready["cpu_s"]) / expected)
        base = median(rates["bare"])
        for kind in ("bare", "mailbox"):
            rate = median(rates[kind])
            out.rows.append(
                Row(
                    "Ingest",
                    f"{KINDS[kind]}, {conns} connection{'s' if conns > 1 else ''}",
                    "mail/s",
                    rate,
                    ratio=ratio(rate, base),
                    baseline="bare aiosmtpd",
                    detail=(
                        f"median of {plan.rounds} round(s) of {plan.ingest:,} mails; "
                        f"DATA→250 p50 {median(rtts[kind]) * 1e3:.2f} ms, "
                        f"p99 {pct(rtts[kind], 99) * 1e3:.2f} ms; "
                        f"server CPU {median(cpu[kind]) * 1e6:.0f} µs/mail"
                    ),
                )
            )
        bare_cpu[conns] = median(cpu["bare"])
        got = ratio(median(rates["mailbox"]), base) or 0.0
        out.targets.append(
            Target(
                f"ingest, {conns} connection{'s' if conns > 1 else ''}: ≥ 0.8× bare aiosmtpd",
                f"{got:.2f}× ({median(rates['mailbox']):,.0f} vs {base:,.0f} mail/s)",
                got >= 0.8,
            )
        )

    # Where the sink's extra CPU goes: its work after DATA, measured call by call.
    found = role_json("costs", "--store", tmp / "costs.sqlite3", "--count", plan.ingest)
    for name, key in (
        ("CPU per mail: `MailSink.accept` (parse + commit + notify)", "accept_cpu"),
        ("CPU per mail: `Store.deliver` alone (the commit)", "deliver_cpu"),
    ):
        out.rows.append(
            Row(
                "Ingest",
                name,
                "µs",
                found[key] * 1e6,
                ratio=ratio(found[key], bare_cpu[1]),
                baseline="bare aiosmtpd server CPU per mail",
                detail=(
                    f"{plan.ingest:,} calls in one thread; bare aiosmtpd used "
                    f"{bare_cpu[1] * 1e6:.0f} µs per mail (1 connection)"
                ),
            )
        )


def bench_wakeup(plan: Plan, tmp: Path, out: Results) -> None:
    """From the client's 250 for DATA to ``wait_for`` returning the claimed message."""
    found: dict[str, dict[str, list[float]]] = {}
    for case in ("bare", "own"):
        found[case] = role_json(
            "waiter",
            "--mode",
            case,
            "--store",
            tmp / f"wake-{case}.sqlite3",
            "--count",
            plan.wakeup,
        )
    shared = tmp / "wake-cross.sqlite3"
    with server("mailbox", shared, 0) as (ready, _):
        found["cross"] = role_json(
            "waiter",
            "--mode",
            "cross",
            "--store",
            shared,
            "--port",
            ready["port"],
            "--count",
            plan.wakeup,
        )
    names = {
        "bare": "floor: bare aiosmtpd list + condition variable",
        "own": "pytest-mailbox, mail from its own process's sink",
        "cross": "pytest-mailbox, mail from another process's sink",
    }
    floor = median(found["bare"]["from_sent"])
    for case, data in found.items():
        values, sent = data["latencies"], data["from_sent"]
        out.rows.append(
            Row(
                "Wake-up",
                names[case],
                "ms",
                median(values) * 1e3,
                p99=pct(values, 99) * 1e3,
                ratio=ratio(median(sent), floor),
                baseline="floor (end of DATA → return)",
                detail=(
                    f"{len(values):,} mails; end of DATA sent → return: "
                    f"p50 {median(sent) * 1e3:.2f} ms, p99 {pct(sent, 99) * 1e3:.2f} ms"
                ),
            )
        )
    own50 = median(found["own"]["latencies"]) * 1e3
    own99 = pct(found["own"]["latencies"], 99) * 1e3
    cross50 = median(found["cross"]["latencies"]) * 1e3
    out.targets += [
        Target("wake-up, own sink: p50 ≤ 2 ms", f"{own50:.2f} ms", own50 <= 2),
        Target("wake-up, own sink: p99 ≤ 10 ms", f"{own99:.2f} ms", own99 <= 10),
        Target("wake-up, another process's sink: p50 ≤ 10 ms", f"{cross50:.2f} ms", cross50 <= 10),
    ]


def bench_claims(plan: Plan, tmp: Path, out: Results) -> None:
    """``wait_for`` on a message already in the mailbox, with N messages in the store."""
    found: dict[int, dict[str, Any]] = {}
    for stored in plan.stored:
        found[stored] = role_json(
            "claims",
            "--store",
            tmp / f"claims-{stored}.sqlite3",
            "--stored",
            stored,
            "--samples",
            plan.claims,
        )
    base = median(found[0]["latencies"]) * 1e3
    for stored, data in found.items():
        p50 = median(data["latencies"]) * 1e3
        out.rows.append(
            Row(
                "Scale",
                f"claim latency, {stored:,} messages stored",
                "ms",
                p50,
                p99=pct(data["latencies"], 99) * 1e3,
                ratio=ratio(p50, base),
                baseline="empty store",
                detail=(
                    f"{len(data['latencies'])} claims; then code + ack + close + receipt: "
                    f"p50 {median(data['rest']) * 1e3:.2f} ms, "
                    f"p99 {pct(data['rest'], 99) * 1e3:.2f} ms; "
                    f"store filled in {data['fill_seconds']:.1f} s"
                ),
            )
        )
    top = max(plan.stored)
    got = ratio(median(found[top]["latencies"]) * 1e3, base) or 0.0
    out.targets.append(
        Target(
            f"claim latency at {top:,} stored ≤ 1.5× empty store",
            f"{got:.2f}× ({median(found[top]['latencies']) * 1e3:.2f} vs {base:.2f} ms)",
            got <= 1.5,
            "" if top == 100_000 else f"{plan.mode} run: {top:,} stored, not 100,000",
        )
    )


def bench_rss(plan: Plan, tmp: Path, out: Results) -> None:
    """Peak RSS growth of the sink process while it ingests ``plan.rss`` mails.

    The baseline is the same process's RSS once started. The bare list sink, which keeps
    every mail in memory, is shown for scale on at most 20,000 mails (it is slow to fill).
    """
    growth: dict[str, float] = {}
    for kind, count in (("mailbox", plan.rss), ("bare", min(plan.rss, 20_000))):
        with server(kind, tmp / f"rss-{kind}.sqlite3", 8) as (ready, report):
            role_json(
                "blast",
                "--port",
                ready["port"],
                "--rcpts",
                ",".join(ready["addresses"]),
                "--count",
                count,
            )
        start, peak = ready["rss_kb"] / 1024, report[0]["peak_rss_kb"] / 1024
        growth[kind] = peak - start
        out.rows.append(
            Row(
                "Scale",
                f"sink process RSS growth, {count:,} mails ({KINDS[kind]})",
                "MB",
                growth[kind],
                ratio=ratio(peak, start),
                baseline="its RSS after start (ratio: peak / start)",
                detail=f"RSS {start:.1f} MB after start, peak {peak:.1f} MB",
            )
        )
    out.targets.append(
        Target(
            "sink RSS growth ≤ 50 MB for 100,000 mails",
            f"{growth['mailbox']:.1f} MB for {plan.rss:,} mails",
            growth["mailbox"] <= 50,
            "" if plan.rss == 100_000 else f"{plan.mode} run: {plan.rss:,} mails, not 100,000",
        )
    )


SUITE_NAMES = {
    "bare": "session-scoped bare aiosmtpd list sink, no isolation",
    "floor": "the contract's floor: that sink + five durable writes + a pydantic contract",
    "smtpdfix": "smtpdfix `smtpd` (a server per test)",
    "mailbox": "pytest-mailbox `isolated_mailbox` (claim + ack + receipt)",
}
SEQUENCE_NAMES = {
    "floor": "the floor's five writes",
    "mailbox": "pytest-mailbox (reserve, delivery, claim, ack, release, receipt)",
}


def bench_suites(plan: Plan, tmp: Path, out: Results) -> None:
    """Wall time of the generated suite with each receiving fixture."""
    kinds = ["bare", "floor", "mailbox"]
    suites.precompile(tmp)
    if importlib.util.find_spec("smtpdfix") is not None:
        kinds.insert(2, "smtpdfix")
    paths = {kind: suites.generate(tmp / "suites", kind, plan.tests) for kind in kinds}
    # A one-test run of each suite splits the wall time into a fixed cost (start-up,
    # imports, the session's sink) and a marginal cost per test. Full runs only.
    ones = {kind: suites.generate(tmp / "one", kind, 1) for kind in kinds}
    walls: dict[str, list[float]] = {kind: [] for kind in kinds}
    cpus: dict[str, list[float]] = {kind: [] for kind in kinds}
    fixed: dict[str, list[float]] = {kind: [] for kind in kinds}
    for _ in range(plan.rounds):
        for kind in kinds:
            timing = suites.run(paths[kind], kind, plan.tests)
            walls[kind].append(timing.wall)
            cpus[kind].append(timing.cpu)
            if plan.mode == "full":
                fixed[kind].append(suites.run(ones[kind], kind, 1).wall)
    base = median(walls["bare"])
    base_cpu = median(cpus["bare"])

    def marginal(kind: str) -> float:
        return (median(walls[kind]) - median(fixed[kind])) / (plan.tests - 1) * 1e3

    for kind in kinds:
        wall = median(walls[kind])
        cpu = median(cpus[kind])
        detail = (
            f"median of {plan.rounds} run(s), `-n 0`; "
            f"{(wall - base) / plan.tests * 1e3:+.2f} ms per test vs bare; "
            f"CPU (user + system, all threads) {cpu:.2f} s, "
            f"{(cpu - base_cpu) / plan.tests * 1e3:+.2f} ms per test vs bare"
        )
        if fixed[kind]:
            detail += (
                f"; fixed cost (1-test run) {median(fixed[kind]):.2f} s, then "
                f"{marginal(kind):.2f} ms per test ({marginal(kind) - marginal('bare'):+.2f} ms "
                "vs bare)"
            )
        out.rows.append(
            Row(
                "Per-test cost",
                f"{plan.tests:,} tests: {SUITE_NAMES[kind]}",
                "s",
                wall,
                ratio=ratio(wall, base),
                baseline="bare list sink",
                detail=detail,
            )
        )
    # Where a test's time goes: one more, instrumented run of each suite (not timed above),
    # inside pytest's setup, call and teardown hooks (reporting between them is not in it).
    split = {
        kind: suites.phases(paths[kind], kind, plan.tests, tmp / f"phases-{kind}.json")
        for kind in kinds
    }

    def spent(kind: str, key: str) -> float:
        return sum(split[kind][phase][key] for phase in phases.PHASES if phase in split[kind])

    for kind in kinds:
        detail = "; ".join(
            f"{phase} {split[kind][phase]['wall_ms']:.2f} ms "
            f"({split[kind][phase]['wall_ms'] - split['bare'][phase]['wall_ms']:+.2f})"
            for phase in phases.PHASES
            if phase in split[kind] and phase in split["bare"]
        )
        out.rows.append(
            Row(
                "Per-test cost",
                f"time in setup + call + teardown: {SUITE_NAMES[kind]}",
                "ms",
                spent(kind, "wall_ms"),
                ratio=ratio(spent(kind, "wall_ms"), spent("bare", "wall_ms")),
                baseline="bare list sink",
                detail=f"{detail} (vs bare); CPU of the test's thread "
                f"{spent(kind, 'cpu_ms'):.2f} ms; one instrumented run",
            )
        )
    # What a test does with its store, without SMTP or pytest: in one thread, the two
    # sequences taking turns, steady where the suites' wall times are not.
    found = role_json(
        "sequence", "--dir", tmp / "sequence", "--count", plan.sequence, "--rounds", plan.rounds
    )
    alone = {kind: found[kind]["cpu"] for kind in ("floor", "mailbox")}
    for kind in ("floor", "mailbox"):
        steps = "; ".join(f"{step} {t * 1e6:.0f}" for step, t in found[kind]["steps"].items())
        out.rows.append(
            Row(
                "Per-test cost",
                f"CPU per test, a test's store work alone: {SEQUENCE_NAMES[kind]}",
                "µs",
                alone[kind] * 1e6,
                ratio=ratio(alone[kind], alone["floor"]),
                baseline="the floor's five writes",
                detail=(
                    f"{plan.sequence:,} tests × {plan.rounds} round(s), in one thread, no SMTP "
                    f"(the CPU of all threads); wall time by step, µs: {steps}"
                ),
            )
        )
    store_work = (alone["mailbox"] - alone["floor"]) * 1e3
    mine = median(walls["mailbox"])
    got = ratio(mine, base) or 0.0
    least = median(walls["floor"])
    out.targets.append(
        Target(
            f"{plan.tests:,}-test suite ≤ 1.2× bare list sink",
            f"{got:.2f}× ({mine:.2f} vs {base:.2f} s)",
            got <= 1.2,
            f"{(mine - base) / plan.tests * 1e3:+.2f} ms per test; CPU "
            f"{(median(cpus['mailbox']) - base_cpu) / plan.tests * 1e3:+.2f} ms per test; "
            f"the floor (five durable writes and a pydantic contract, nothing else): "
            f"{ratio(least, base) or 0.0:.2f}×; pytest-mailbox's store work alone: "
            f"{store_work:+.2f} ms of CPU per test over the floor's, "
            f"{store_work / (base / plan.tests * 1e3):.2f}× the bare suite's time per test",
        )
    )
    if "smtpdfix" in walls:
        theirs = median(walls["smtpdfix"])
        out.targets.append(
            Target(
                f"{plan.tests:,}-test suite faster than smtpdfix",
                f"{mine:.2f} vs {theirs:.2f} s ({mine / theirs:.2f}×)",
                mine < theirs,
                f"{(mine - theirs) / plan.tests * 1e3:+.2f} ms per test",
            )
        )
    else:
        out.targets.append(
            Target(
                "suite faster than smtpdfix",
                "smtpdfix not installed",
                None,
                "`make bench` installs it",
            )
        )


def bench_xdist(plan: Plan, tmp: Path, out: Results) -> None:
    """``-n 2`` against ``-n 0`` for the pytest-mailbox suite, and for the bare one.

    Each round runs a suite at ``-n 0`` and at ``-n 2`` back to back (the two kinds take
    turns going first), and the speed-up is the median of those paired ratios: the
    machine's speed drifts between rounds by more than the figure being measured, and a
    ratio of medians taken in different rounds carries that drift.
    """
    kinds = ["bare", "mailbox"]
    suites.precompile(tmp)
    runs: dict[tuple[str, int], list[suites.Timing]] = {}
    paths = {kind: suites.generate(tmp / "xdist", kind, plan.tests) for kind in kinds}
    rounds = plan.rounds
    for r in range(rounds):
        for kind in kinds if r % 2 == 0 else kinds[::-1]:
            for workers in (0, 2):
                timing = suites.run(paths[kind], kind, plan.tests, workers=workers)
                runs.setdefault((kind, workers), []).append(timing)
    speedup, floor = {}, {}
    for kind in kinds:
        pairs = list(zip(runs[kind, 0], runs[kind, 2], strict=True))
        paired = [two.wall / zero.wall for zero, two in pairs]
        speedup[kind] = median(paired)
        # What the round's `-n 2` run would have taken on every core, busy from start to
        # end, with the CPU it used: the best speed-up that CPU allowed.
        floor[kind] = median([two.cpu / CORES / zero.wall for zero, two in pairs])
        each = ", ".join(f"{x:.2f}×" for x in paired)
        for workers in (0, 2):
            wall = median([t.wall for t in runs[kind, workers]])
            cpu = median([t.cpu for t in runs[kind, workers]])
            detail = (
                f"median of {rounds} run(s); CPU (user + system, all processes) {cpu:.2f} s, "
                f"{cpu / wall:.2f} of {CORES} cores busy"
            )
            if workers:
                detail += (
                    f"; ratio: median of each round's, {each}; that CPU on {CORES} cores "
                    f"busy throughout: {floor[kind]:.2f}×"
                )
            out.rows.append(
                Row(
                    "pytest-xdist",
                    f"{plan.tests:,} tests, `-n {workers}`: {SUITE_NAMES[kind]}",
                    "s",
                    wall,
                    ratio=1.0 if workers == 0 else speedup[kind],
                    baseline="same suite, `-n 0`",
                    detail=detail,
                )
            )
    note = (
        f"bare list sink suite: {speedup['bare']:.2f}×; the `-n 2` run's CPU on {CORES} "
        f"cores busy throughout: {floor['mailbox']:.2f}× (bare {floor['bare']:.2f}×)"
    )
    out.targets.append(
        Target(
            f"{plan.tests:,}-test suite: `-n 2` ≤ 0.65× `-n 0`",
            f"{speedup['mailbox']:.2f}×",
            speedup["mailbox"] <= 0.65,
            note,
        )
    )


BENCH: dict[str, Callable[[Plan, Path, Results], None]] = {
    "ingest": bench_ingest,
    "wakeup": bench_wakeup,
    "claims": bench_claims,
    "rss": bench_rss,
    "suites": bench_suites,
    "xdist": bench_xdist,
}


# -- the machine and its load ----------------------------------------------------------


class LoadSampler:
    """Samples the 1-minute load average every few seconds while the benchmarks run."""

    def __init__(self, every: float = 2.0) -> None:
        self.every = every
        self.samples: list[float] = [os.getloadavg()[0]]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.samples.append(os.getloadavg()[0])

    def __enter__(self) -> LoadSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(os.getloadavg()[0])


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def machine() -> dict[str, str]:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    info = {
        "cores": f"{os.cpu_count()} ({model or platform.processor() or 'unknown CPU'})",
        "system": f"{platform.system()} {platform.release()} {platform.machine()}",
        "Python": f"{platform.python_implementation()} {platform.python_version()}",
        "SQLite": sqlite3.sqlite_version,
    }
    for dist in ("pytest-mailbox", "aiosmtpd", "smtpdfix", "pytest", "pytest-xdist", "pydantic"):
        info[dist] = version(dist)
    return info


# -- output ----------------------------------------------------------------------------


def fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit in ("mail/s", "µs"):
        return f"{value:,.0f}"
    return f"{value:,.2f}"


def verdict(met: bool | None) -> str:
    return {True: "met", False: "**missed**", None: "not measured"}[met]


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |" for row in rows]
    return lines


def text_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(str(c)) for c in col) for col in zip(header, *rows, strict=True)]
    line = "  ".join("{:<%d}" % w for w in widths)  # noqa: UP031 - a format of a format
    rule = "  ".join("-" * w for w in widths)
    return [line.format(*header), rule, *(line.format(*row) for row in rows)]


ROW_HEADER = ("section", "figure", "unit", "median", "p99", "ratio", "baseline", "detail")
TARGET_HEADER = ("target", "measured", "result", "note")


def row_cells(row: Row) -> list[str]:
    return [
        row.section,
        row.name,
        row.unit,
        fmt(row.value, row.unit),
        fmt(row.p99, row.unit),
        "—" if row.ratio is None else f"{row.ratio:.2f}×",
        row.baseline,
        row.detail,
    ]


def target_cells(target: Target) -> list[str]:
    return [target.text, target.measured, verdict(target.met), target.note]


def report(
    plan: Plan, results: Results, info: dict[str, str], load: list[float], took: float
) -> str:
    """The generated part of docs/performance.md."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [
        BEGIN,
        "",
        f"## Latest run: `{plan.mode}`, {when}, {took / 60:.1f} min",
        "",
        "Generated by `make bench` (`benchmarks/run.py`); edit outside the markers only.",
        "",
        *markdown_table(("machine", ""), list(info.items())),
        "",
        f"Load while it ran (1-minute load average, sampled every 2 s, {os.cpu_count()} cores): "
        f"min {min(load):.1f}, median {median(load):.1f}, max {max(load):.1f}.",
        "",
        "### Targets",
        "",
        *markdown_table(TARGET_HEADER, [target_cells(t) for t in results.targets]),
        "",
    ]
    for section in dict.fromkeys(r.section for r in results.rows):
        rows = [r for r in results.rows if r.section == section]
        lines += [
            f"### {section}",
            "",
            *markdown_table(ROW_HEADER[1:], [row_cells(r)[1:] for r in rows]),
            "",
        ]
    if results.errors:
        lines += ["### Errors", "", *(f"- {e}" for e in results.errors), ""]
    lines.append(END)
    return "\n".join(lines)


SKELETON = """# Performance

What a mailbox per test costs, measured beside the alternatives in the same run.
Run it yourself with `make bench` (a few minutes) or `make bench ARGS=--quick` (under a
minute). The section between the markers is rewritten by every run.

{generated}
"""


def write(out: Path, generated: str) -> None:
    """Replace the generated section of ``out``, keeping what people wrote around it."""
    if out.exists():
        text = out.read_text(encoding="utf-8")
        head, sep, rest = text.partition(BEGIN)
        _, sep2, tail = rest.partition(END)
        if sep and sep2:
            out.write_text(head + generated + tail, encoding="utf-8")
            return
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(SKELETON.format(generated=generated), encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="benchmarks/run.py", description=__doc__.split("\n")[0])
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="Smaller counts, one round: < 1 min")
    mode.add_argument("--smoke", action="store_true", help="Tiny counts: checks the harness only")
    parser.add_argument("--only", default=",".join(BENCHMARKS), help="Comma-separated subset")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="The Markdown file to write")
    parser.add_argument("--json", type=Path, help="Also write the raw results as JSON here")
    args = parser.parse_args(argv)
    plan = PLANS["quick" if args.quick else "smoke" if args.smoke else "full"]
    chosen = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = sorted(set(chosen) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark(s) {unknown}; choose from {list(BENCHMARKS)}")
    results = Results()
    info = machine()
    started = time.perf_counter()
    print(f"pytest-mailbox benchmarks, {plan.mode} run: {', '.join(chosen)}", flush=True)
    with tempfile.TemporaryDirectory(prefix="mailbox-bench-") as tmp, LoadSampler() as load:
        for name in chosen:
            t0 = time.perf_counter()
            try:
                BENCH[name](plan, Path(tmp), results)
            except Exception as exc:
                traceback.print_exc()
                results.errors.append(f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            print(f"  {name}: {time.perf_counter() - t0:.1f} s", flush=True)
    took = time.perf_counter() - started
    print()
    print("\n".join(text_table(ROW_HEADER, [row_cells(r) for r in results.rows])))
    print()
    print("\n".join(text_table(TARGET_HEADER, [target_cells(t) for t in results.targets])))
    for error in results.errors:
        print(f"error: {error}")
    write(args.out, report(plan, results, info, load.samples, took))
    print(f"\nwrote {args.out} ({took:.0f} s)")
    if args.json:
        data = {
            "plan": asdict(plan),
            "machine": info,
            "load": load.samples,
            "rows": [asdict(r) for r in results.rows],
            "targets": [asdict(t) for t in results.targets],
            "errors": results.errors,
        }
        args.json.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return 1 if results.errors else 0


if __name__ == "__main__":
    sys.exit(main())
