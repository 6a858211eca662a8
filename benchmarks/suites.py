"""Per-test cost: one generated suite, three ways of receiving its mail, run by real ``pytest``.

Every test sends one mail with ``smtplib`` (a new connection, as an app's mail backend
opens one) and waits for it. Only the fixture that receives the mail differs:

- ``bare``: a session-scoped bare aiosmtpd sink appending to a list; no isolation;
- ``floor``: the bare sink plus the five durable writes of a mailbox per test, and nothing
  else (``benchmarks/floor.py``): the contract's floor on a stock aiosmtpd sink;
- ``smtpdfix``: smtpdfix's function-scoped ``smtpd`` fixture (a new server per test);
- ``mailbox``: pytest-mailbox's ``isolated_mailbox``: reserve, wait, claim, ack, receipt.
"""

from __future__ import annotations

import compileall
import importlib.metadata
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
PER_MODULE = 100
#: Environment that would change what a suite does; the runs start without it.
_FOREIGN_ENV = ("PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_MAILBOX_", "SMTPD_")

#: Plugins a suite may use; every other plugin installed in .venv is disabled in every run.
RELATED = ("mailbox", "smtpd", "xdist", "xdist.looponfail")
#: Plugins each kind does not use (the receiving fixture of the other two kinds).
NOT_MINE = {
    "bare": ("mailbox", "smtpd"),
    "floor": ("mailbox", "smtpd"),
    "smtpdfix": ("mailbox",),
    "mailbox": ("smtpd",),
}

_SEND = '''
import smtplib

MAIL = (
    "From: Example App <noreply@app.example.test>\\r\\n"
    "To: {rcpt}\\r\\n"
    "Subject: {subject}\\r\\n"
    "MIME-Version: 1.0\\r\\n"
    "Content-Type: text/plain; charset=utf-8\\r\\n"
    "\\r\\n"
    "Open https://app.example.test/verify?token=Jx4c2VmZ3Rva2Vu or enter 482913.\\r\\n"
)


def send(host, port, rcpt, subject):
    """What an app's SMTP mail backend does: connect, send one mail, quit."""
    with smtplib.SMTP(host, port, local_hostname="client.test") as smtp:
        smtp.sendmail("noreply@app.example.test", [rcpt], MAIL.format(rcpt=rcpt, subject=subject))
'''

CONFTEST = {
    "bare": _SEND
    + '''
import pytest

from benchmarks.smtp import ListSink


@pytest.fixture(scope="session")
def bare_sink():
    """One bare aiosmtpd list sink for the whole session: no isolation at all."""
    sink = ListSink().start()
    yield sink
    sink.stop()
''',
    "floor": _SEND
    + '''
import pytest

from benchmarks import floor as store


@pytest.fixture(scope="session")
def floor(tmp_path_factory):
    """The bare sink, committing each message to a shared SQLite store before its 250."""
    found = store.start(tmp_path_factory.mktemp("floor") / "store.sqlite3")
    yield found
    found.sink.stop()


@pytest.fixture
def box(floor):
    """A reservation: one durable write, and one more to release it."""
    alias, fence = store.reserve(floor)
    yield alias, fence
    store.release(floor, alias)
''',
    "smtpdfix": _SEND,
    "mailbox": _SEND,
}

TEST = {
    "bare": """
import threading

import pytest

from conftest import send


@pytest.mark.parametrize("n", range({count}))
def test_mail(bare_sink, n):
    subject = f"Verify {module}-{{n}}"
    send(bare_sink.host, bare_sink.port, "user@mailbox.test", subject)
    raw = bare_sink.handler.wait_for(subject, 10, threading.Event())
    assert b"482913" in raw
""",
    "floor": """
import threading

import pytest

from benchmarks import floor as store
from conftest import send


@pytest.mark.parametrize("n", range({count}))
def test_mail(floor, box, n):
    alias, fence = box
    subject = f"Verify {module}-{{n}}"
    send(floor.sink.host, floor.sink.port, alias, subject)
    raw = floor.sink.handler.wait_for(subject, 10, threading.Event())
    assert b"482913" in raw
    store.claim_and_ack(floor, alias, fence)
""",
    "smtpdfix": """
import pytest

from conftest import send


@pytest.mark.parametrize("n", range({count}))
def test_mail(smtpd, n):
    subject = f"Verify {module}-{{n}}"
    send(smtpd.hostname, smtpd.port, "user@mailbox.test", subject)
    (message,) = smtpd.messages
    assert message["Subject"] == subject
""",
    "mailbox": """
import pytest

from conftest import send


@pytest.mark.parametrize("n", range({count}))
def test_mail(mailbox_server, isolated_mailbox, n):
    subject = f"Verify {module}-{{n}}"
    send(mailbox_server.host, mailbox_server.port, isolated_mailbox.address, subject)
    message = isolated_mailbox.wait_for(subject=subject, timeout=10)
    message.ack()
""",
}


def generate(base: Path, kind: str, count: int) -> Path:
    """Write the ``kind`` suite of ``count`` tests (modules of up to 100) under ``base``."""
    path = base / kind
    path.mkdir(parents=True, exist_ok=True)
    (path / "pytest.ini").write_text("[pytest]\n")
    (path / "conftest.py").write_text(CONFTEST[kind])
    module = 0
    left = count
    while left > 0:
        size = min(PER_MODULE, left)
        source = TEST[kind].format(count=size, module=module)
        (path / f"test_mail_{module:02d}.py").write_text(source)
        left -= size
        module += 1
    return path


def precompile(base: Path) -> None:
    """Write the bytecode the timed runs would otherwise compile again in every process.

    The runs set ``PYTHONDONTWRITEBYTECODE`` so the generated suites leave nothing behind,
    and this checkout's editable install has no bytecode of its own. pytest loads a
    plugin through its assertion rewriter, which caches the rewritten module (beside the
    source, ``*-pytest-<version>.pyc``) only where bytecode may be written: one untimed
    run that may, and every timed run reads it, as a user's second run reads what the
    first wrote. The benchmark helpers (``benchmarks.smtp``, imported by the bare suite)
    are plain imports: ``compileall``. The warm-up runs one test of the mailbox suite, since
    the plugin imports its sink, store and mailbox modules only when a test needs them.
    """
    compileall.compile_dir(ROOT / "benchmarks", quiet=1)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)},
        "PYTHONPATH": str(ROOT),
    }
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    empty = base / "warm-up"
    empty.mkdir(parents=True, exist_ok=True)
    (empty / "pytest.ini").write_text("[pytest]\n")
    # No tests to collect: pytest exits 5, having imported (and cached) every plugin.
    argv = [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"]
    subprocess.run(argv, cwd=empty, env=env, capture_output=True, check=False)
    one = generate(base / "warm-up-mailbox", "mailbox", 1)
    subprocess.run(command("mailbox", None), cwd=one, env=env, capture_output=True, check=False)


def phases(path: Path, kind: str, count: int, out: Path) -> dict[str, dict[str, float]]:
    """One more run of the suite, instrumented: {phase: {wall_ms, cpu_ms, tests}}."""
    run(path, kind, count, phases=out)
    result: dict[str, dict[str, float]] = json.loads(out.read_text(encoding="utf-8"))
    return result


def unrelated() -> list[str]:
    """The installed pytest plugins no suite uses (pytest-cov, hypothesis, anyio, …)."""
    names = {ep.name for ep in importlib.metadata.entry_points(group="pytest11")}
    return ["cacheprovider", *sorted(names - set(RELATED))]


def command(kind: str, workers: int | None) -> list[str]:
    """The pytest command line: unrelated plugins off, xdist off unless ``workers`` is set."""
    args = [sys.executable, "-m", "pytest", "-q"]
    disabled = [*unrelated(), *NOT_MINE[kind]]
    if workers is None:
        disabled += ["xdist", "xdist.looponfail"]
    for name in disabled:
        args += ["-p", f"no:{name}"]
    if workers is not None:
        args += ["-n", str(workers)]
    return [*args, "--basetemp", "basetemp"]


class Timing(NamedTuple):
    """One run of a suite: the ``pytest`` process's wall time, and the CPU time (user and
    system, in seconds) of that process and of every process it started (xdist's workers)."""

    wall: float
    cpu: float


def _children_cpu() -> float:
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(
    path: Path, kind: str, count: int, workers: int | None = None, phases: Path | None = None
) -> Timing:
    """Run the suite once; its wall time and the CPU time of all its processes.

    ``phases`` also loads ``benchmarks.phases``, which writes the suite's time per test in
    setup, call and teardown to that file.
    """
    extra = {} if phases is None else {"BENCH_PHASES": str(phases)}
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(_FOREIGN_ENV)},
        "PYTHONPATH": str(ROOT),
        "SMTPD_HOST": "127.0.0.1",  # smtpdfix: loopback only (its default is "localhost")
        "PYTHONDONTWRITEBYTECODE": "1",
        **extra,
    }
    argv = command(kind, workers)
    if phases is not None:
        argv[4:4] = ["-p", "benchmarks.phases"]
    # The workers are the controller's children: it waits for them, so their CPU time is
    # in its own children's, and so in ours once it has exited.
    cpu = _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(
        argv, cwd=path, env=env, capture_output=True, text=True, timeout=1800, check=False
    )
    elapsed = time.perf_counter() - start
    cpu = _children_cpu() - cpu
    passed = re.search(r"(\d+) passed", done.stdout)
    if done.returncode != 0 or passed is None or int(passed.group(1)) != count:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        msg = f"the {kind} suite did not pass ({' '.join(argv[3:])}):\n{tail}"
        raise RuntimeError(msg)
    return Timing(elapsed, cpu)
