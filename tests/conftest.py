"""Shared test setup."""

from __future__ import annotations

# Hypothesis' pytest plugin imports hypothesis lazily at the end of every session; pytester
# runs in-process and drops modules first imported inside a run, so each inner run would pay
# that import again (about 1.5 s). Importing it once here keeps it loaded.
import random
import signal
import socket
from collections.abc import Iterator
from pathlib import Path

import hypothesis.internal.observability  # noqa: F401
import pytest
from storekit import Clock

from pytest_mailbox import EmailContract, Mailbox, MailSink, message
from pytest_mailbox.store import Store

# The tests of Ctrl-C and of a stopped MCP server send SIGINT to a run or a server they
# start. A shell without job control starts a background job (`make test &`) with SIGINT
# ignored, and an ignored signal stays ignored across exec: those processes would never
# see it. A handler set here is reset to the default in each process started from here.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def pytester(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.Pytester:
    """Inner runs without pytest-asyncio, which warns when its ini option is unset there,
    without pytest-randomly where a developer has it: an inner file's tests run in
    their order (the first sets up what the next one checks), and without pytest-retry,
    which can be configured once a process (a second in-process run is an INTERNALERROR:
    "no option named 'filtered_exceptions'"); a test of it runs it in a process of its own."""
    run = pytester.runpytest

    def runpytest(*args: str | object, **kwargs: object) -> pytest.RunResult:
        blocked = ("-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry")
        return run(*blocked, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(pytester, "runpytest", runpytest)
    return pytester


@pytest.fixture(autouse=True)
def extracted_by_this_test_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The process remembers what earlier tests extracted and masks it everywhere: a check
    that a secret is kept out of a text must not pass because another test on this worker
    extracted the same value (the fixed codes of these tests) before."""
    monkeypatch.setattr(message, "_EXTRACTED", {})


@pytest.fixture
def fixed_port() -> int:
    """A free port for fixed-port mode (``--mailbox-port``), for the plugin to bind itself.

    From below the kernel's ephemeral range: a port bound to 0 and released again may be
    handed to any client socket (another worker's SMTP connection) before the plugin binds
    it; the kernel never hands out one from below its range."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):  # not Linux: the ephemeral range starts at 49152
        low = 49152
    below = range(max(1024, low - 10_000), low)
    # SystemRandom: a plugin that seeds ``random`` alike in every worker (pytest-randomly)
    # would give both workers the same ports to try.
    for port in random.SystemRandom().sample(below, min(200, len(below))):
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket() as probe:  # none free below the range (it starts at 1024, say)
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def clock() -> Clock:
    """The time a ``store`` sees, moved by hand."""
    return Clock()


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "mailbox.sqlite3"


@pytest.fixture
def store(db: Path, clock: Clock) -> Iterator[Store]:
    """A store of its own on a file in tmp_path, on the hand-moved clock."""
    handle = Store(db, clock=clock)
    yield handle
    handle.close()


@pytest.fixture
def second_mailbox(
    isolated_mailbox: Mailbox,
    mailbox_server: MailSink,
    mailbox_store: Store,
    email_contract: EmailContract,
    request: pytest.FixtureRequest,
) -> Iterator[Mailbox]:
    """Another run's mailbox on the same domain, built the way the isolated_mailbox fixture is."""
    other = Mailbox.reserve(
        mailbox_store,
        contract=email_contract,
        domain=isolated_mailbox.domain,
        nodeid=request.node.nodeid,
        signal=mailbox_server.signal,
    )
    yield other
    other.close(success=True)
