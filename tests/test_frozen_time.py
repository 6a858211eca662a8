"""Tests that freeze or move time (freezegun, time-machine) around the mail they wait for.

The plugin's clocks are the machine's: a wait's deadline comes, the store's times are the
sink's clock whatever the test's clock says, and no worker's fake clock expires another
worker's mailbox. Inner runs go through a subprocess: a wait that never ends must fail
this test at its timeout, not hang it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime
from types import SimpleNamespace

import pytest

from pytest_mailbox.receipts import read_receipts

SENDER_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture
def send(mailbox_server):
    def send(to, subject="Verify your account", body="Open https://app.example.test/verify"):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = subject
        msg.set_content(body)
        with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
            smtp.send_message(msg)
    return send
"""

HANG_NET = 120  # seconds: only for a wait that never ends


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeconftest(SENDER_CONFTEST)
    return pytester.runpytest_subprocess(
        "-p", "no:randomly", "-p", "no:asyncio", *args, timeout=HANG_NET
    )


WAITS_UNDER_A_FROZEN_CLOCK = """
import freezegun
import pytest

from pytest_mailbox import WaitTimeout


@freezegun.freeze_time("2020-01-01 12:00:00")
def test_decorated(isolated_mailbox):
    with pytest.raises(WaitTimeout, match="no message"):
        isolated_mailbox.wait_for(subject="Never sent", timeout=0.2)


def test_in_a_with_block(isolated_mailbox):
    with freezegun.freeze_time("2020-01-01 12:00:00"):
        isolated_mailbox.expect_none(subject="Never sent", within=0.2)


@freezegun.freeze_time("2020-01-01 12:00:00", tick=True)
def test_ticking(isolated_mailbox):
    with pytest.raises(WaitTimeout, match="no message"):
        isolated_mailbox.wait_for(subject="Never sent", timeout=0.2)


def test_with_the_freezer_fixture(freezer, isolated_mailbox):
    freezer.move_to("2020-01-01 12:00:00")
    with pytest.raises(WaitTimeout, match="no message"):
        isolated_mailbox.wait_for(subject="Never sent", timeout=0.2)


def test_agent_waits(isolated_mailbox):
    tools = isolated_mailbox.agent_tools()
    fixture_id = tools.call("reserve_mailbox", {"purpose": "mail", "ttl": 60})["fixture_id"]
    with freezegun.freeze_time("2020-01-01 12:00:00"):
        answer = tools.call(
            "wait_for_message", {"fixture_id": fixture_id, "kind": "link", "timeout": 0.2}
        )
    assert answer["status"] == "waiting", answer
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_wait_ends_at_its_timeout_under_a_frozen_clock(
    pytester: pytest.Pytester, workers: str
) -> None:
    # freezegun freezes time.monotonic: a wait that found nothing never reached its
    # deadline and hung the test (killed here by the hang net after 120 s).
    pytester.makepyfile(WAITS_UNDER_A_FROZEN_CLOCK)

    result = _run(pytester, "-n", workers)

    result.assert_outcomes(passed=5)


ASYNC_WAITS_UNDER_A_FROZEN_CLOCK = """
import anyio
import freezegun
import pytest

from pytest_mailbox import WaitTimeout


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_async_waits(isolated_mailbox, send, anyio_backend):
    with freezegun.freeze_time("2020-01-01 12:00:00"):  # no real_asyncio, as the freezer's
        with pytest.raises(WaitTimeout, match="no message"):
            await isolated_mailbox.wait_for_async(subject="Never sent", timeout=0.2)
        await isolated_mailbox.expect_none_async(subject="Never sent", within=0.2)
        async with anyio.create_task_group() as app:
            app.start_soon(anyio.to_thread.run_sync, send, isolated_mailbox.address)
            msg = await isolated_mailbox.wait_for_async(subject="Verify your account")
        msg.ack()


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_real_asyncio_is_asyncio_s_only(isolated_mailbox, anyio_backend):
    with freezegun.freeze_time("2020-01-01 12:00:00", real_asyncio=True):
        with pytest.raises(WaitTimeout, match="no message"):
            await isolated_mailbox.wait_for_async(subject="Never sent", timeout=0.2)
"""


def test_an_async_wait_ends_at_its_timeout_under_a_frozen_clock(
    pytester: pytest.Pytester,
) -> None:
    # The async waits slept on the test's event loop, whose clock freezegun freezes:
    # asyncio's time.monotonic unless real_asyncio=True, trio's time.perf_counter always.
    # Their polls never woke: the wait hung even after the mail came.
    pytest.importorskip("anyio")  # not in the lowest versions' venv (make mindeps)
    pytest.importorskip("trio")
    pytester.makepyfile(ASYNC_WAITS_UNDER_A_FROZEN_CLOCK)

    result = _run(pytester)

    result.assert_outcomes(passed=3)


SIGN_UP_AND_COME_BACK_A_DAY_LATER = """
import datetime as dt
import time

import freezegun
import pytest
import time_machine

LATER = dt.timedelta(hours=25)
START = dt.datetime(2030, 1, 1, 12, tzinfo=dt.timezone.utc)


def sign_up(send, mailbox):
    # The app's link expires after 24 hours of the app's clock: the test's fake one.
    expires = int(time.time()) + 24 * 3600
    send(mailbox.address, body=f"Open https://app.example.test/verify?expires={expires}")
    return expires


def expired(msg):
    link = msg.link(domain="app.example.test")
    return int(link.rpartition("expires=")[2]) < time.time()


@pytest.mark.email_contract(ttl=60, lease=30)
def test_time_machine_travel(isolated_mailbox, send):
    with time_machine.travel(START, tick=False) as traveller:
        sign_up(send, isolated_mailbox)
        traveller.shift(LATER)
        msg = isolated_mailbox.wait_for(subject="Verify your account", timeout=10)
        assert expired(msg)
        msg.ack()


@pytest.mark.email_contract(ttl=60, lease=30)
def test_time_machine_ticking(isolated_mailbox, send):
    with time_machine.travel(START, tick=True) as traveller:
        sign_up(send, isolated_mailbox)
        msg = isolated_mailbox.wait_for(subject="Verify your account", timeout=10)
        traveller.shift(LATER)
        assert expired(msg)
        msg.ack()


@pytest.mark.email_contract(ttl=60, lease=30)
@pytest.mark.time_machine(START, tick=False)
def test_time_machine_marker(isolated_mailbox, send, time_machine):
    sign_up(send, isolated_mailbox)
    time_machine.shift(LATER)
    msg = isolated_mailbox.wait_for(subject="Verify your account", timeout=10)
    assert expired(msg)
    msg.ack()


@pytest.mark.email_contract(ttl=60, lease=30)
def test_freezegun(isolated_mailbox, send):
    with freezegun.freeze_time(START) as frozen:
        sign_up(send, isolated_mailbox)
        frozen.tick(LATER)
        msg = isolated_mailbox.wait_for(subject="Verify your account", timeout=10)
        assert expired(msg)
        msg.ack()


@pytest.mark.email_contract(ttl=60, lease=30)
def test_freezer_fixture(freezer, isolated_mailbox, send):
    freezer.move_to(START)
    sign_up(send, isolated_mailbox)
    freezer.tick(LATER)
    msg = isolated_mailbox.wait_for(subject="Verify your account", timeout=10)
    assert expired(msg)
    msg.ack()
"""


def _moments(value: object) -> list[datetime]:
    """Every datetime in a receipt's dump, but its ``expires_at`` (``ttl`` ahead)."""
    if isinstance(value, datetime):
        return [value]
    if isinstance(value, dict):
        return [m for key, item in value.items() if key != "expires_at" for m in _moments(item)]
    if isinstance(value, list):
        return [m for item in value for m in _moments(item)]
    return []


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_sign_up_checked_a_day_later_by_a_moved_clock_keeps_its_mailbox(
    pytester: pytest.Pytester, workers: str
) -> None:
    # time-machine moves time.time itself: the store read the test's clock, so 25 hours
    # on, the mailbox (ttl 60 s) had "outlived its ttl" and wait_for raised MailboxClosed;
    # its receipt said the mail came in 2030.
    pytester.makepyfile(SIGN_UP_AND_COME_BACK_A_DAY_LATER)
    receipts = pytester.path / "receipts.jsonl"
    before = time.time()

    result = _run(pytester, "-n", workers, f"--mailbox-receipts={receipts}")

    after = time.time()
    result.assert_outcomes(passed=5)
    read = read_receipts(receipts)
    assert [(r.close_reason, len(r.messages)) for r in read] == [("released_success", 1)] * 5
    for receipt in read:  # the sink's clock, never the test's
        moments = _moments(receipt.model_dump())
        assert moments
        assert all(before <= moment.timestamp() <= after for moment in moments), receipt


ONE_WORKER_S_CLOCK_AND_ANOTHER_S_MAILBOX = {
    "test_reserves_in_2020": """
import datetime as dt
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.email_contract(ttl=60, lease=30)
@pytest.mark.time_machine(dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc), tick=False)
def test_reserves_in_2020(isolated_mailbox, send):
    (HERE / "reserved").write_text("reserved\\n")  # the other worker goes on
    assert (HERE / "swept").read_text() == "swept\\n"
    send(isolated_mailbox.address)
    isolated_mailbox.wait_for(subject="Verify your account", timeout=10).ack()
""",
    "test_moves_a_day_on": """
import datetime as dt
from pathlib import Path

import pytest

HERE = Path(__file__).parent


@pytest.mark.email_contract(ttl=60, lease=30)
def test_moves_a_day_on(isolated_mailbox, send, time_machine):
    try:
        assert (HERE / "reserved").read_text() == "reserved\\n"
        send(isolated_mailbox.address)
        time_machine.move_to(dt.datetime.now(dt.timezone.utc) + dt.timedelta(hours=25))
        # Its wait writes to the store, which sweeps every overdue mailbox there is.
        isolated_mailbox.wait_for(subject="Verify your account", timeout=10).ack()
    finally:
        (HERE / "swept").write_text("swept\\n")
""",
}


def test_a_worker_s_moved_clock_expires_no_other_worker_s_mailbox(
    pytester: pytest.Pytester,
) -> None:
    # The store's sweep expires every overdue mailbox, whoever holds it. A mailbox
    # reserved under time-machine's 2020 was overdue to every worker on the real clock,
    # and a worker 25 hours on expired the others' (and its own) at its next write: each
    # test's wait raised MailboxClosed ("outlived its ttl"). (--dist loadfile gives each
    # file a worker of its own; the FIFOs order them.)
    pytester.makepyfile(**ONE_WORKER_S_CLOCK_AND_ANOTHER_S_MAILBOX)
    os.mkfifo(pytester.path / "reserved")
    os.mkfifo(pytester.path / "swept")

    result = _run(pytester, "-n", "2", "--dist", "loadfile")

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        ["mailbox: 2 reserved, 2 received, 2 claimed, 2 consumed, 0 expired*"]
    )


SENDS_UNDER_AN_AUTO_TICKING_CLOCK = """
import time

import freezegun


def test_sends_and_waits(isolated_mailbox, send):
    with freezegun.freeze_time("2020-01-01 12:00:00", auto_tick_seconds=1):
        before = time.time()
        send(isolated_mailbox.address)
        isolated_mailbox.wait_for(subject="Verify your account", timeout=10).ack()
        assert time.time() - before == 1  # this second read, and no one else's
"""


def test_the_sink_moves_no_auto_ticking_clock_of_the_test(pytester: pytest.Pytester) -> None:
    # auto_tick_seconds moves the frozen clock at every read of it, in every thread: the
    # sink's event loop read time.monotonic() on each turn, and sending one message moved
    # the test's clock by 6 s.
    pytester.makepyfile(SENDS_UNDER_AN_AUTO_TICKING_CLOCK)

    result = _run(pytester)

    result.assert_outcomes(passed=1)


RECEIVED_AFTER_BY_A_FROZEN_CLOCK = """
from datetime import datetime, timezone

import freezegun


@freezegun.freeze_time("2100-01-01 12:00:00")
def test_waits_for_mail_after_now(isolated_mailbox, send):
    send(isolated_mailbox.address)
    since = datetime.now(timezone.utc)  # the test's clock: 2100
    isolated_mailbox.wait_for(subject="Verify your account", received_after=since, timeout=0.2)
"""


def test_a_timeout_says_when_received_after_is_later_than_the_sink_s_clock(
    pytester: pytest.Pytester,
) -> None:
    # received_after=datetime.now() under a frozen clock is the test's time, beside the
    # sink's: the timeout said "received before received_after" and no more.
    pytester.makepyfile(RECEIVED_AFTER_BY_A_FROZEN_CLOCK)

    result = _run(pytester)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "E *no message for * matched subject='Verify your account'*",
            "E *near misses (1):",
            "E *- m-* 'Verify your account': received before received_after",
            "E *received_after (12:00:00.000 UTC on 2100-01-01) is later than the sink's "
            "clock (*:*:*.* UTC on *-*-*): only a message that arrives after it matches. "
            "The sink's clock is the machine's, not a test's frozen or moved one "
            "(freezegun, time-machine): received_after=isolated_mailbox.checkpoint() "
            "needs no clock",
        ]
    )


IMPORTED_WHILE_FROZEN = """
import freezegun
import freezegun.api as real  # its real_* functions: the one module it does not patch

with freezegun.freeze_time("2020-01-01 12:00:00"):
    from pytest_mailbox import _clock

    before, wall, after = real.real_time(), _clock.wall(), real.real_time()
    assert before <= wall <= after, (before, wall, after)
    before, tick, after = real.real_monotonic(), _clock.monotonic(), real.real_monotonic()
    assert before <= tick <= after, (before, tick, after)
"""


def test_the_clocks_are_the_machine_s_though_imported_under_a_frozen_clock() -> None:
    # A script (or a first test that freezes time before it touches the mailbox) may
    # import the plugin's core while time.time is freezegun's: kept as it was, the
    # "real" clock would be the frozen one for the rest of the process.
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", IMPORTED_WHILE_FROZEN],
        capture_output=True,
        text=True,
        timeout=HANG_NET,
        check=False,
    )
    assert done.returncode == 0, done.stderr


class _Travels:
    """time_machine as another thread sees it: its travel ends (or starts) between the
    plugin's look at ``escape_hatch.is_travelling()`` and its read of the time."""

    def __init__(self, *travelling: bool) -> None:
        self._travelling = list(travelling)
        self.escape_hatch = SimpleNamespace(
            is_travelling=self._is_travelling, time=SimpleNamespace(time=self._time)
        )

    def _is_travelling(self) -> bool:
        return self._travelling.pop(0) if len(self._travelling) > 1 else self._travelling[0]

    def _time(self) -> float:  # as time-machine's: the real time, while it travels
        if not self._travelling[0]:
            msg = "Not currently time-travelling."
            raise ValueError(msg)
        return time.time()


def test_the_wall_clock_is_the_machine_s_when_a_travel_ends_during_its_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The sink's thread read wall() as the test's travel ended: the escape hatch raised
    # ValueError, and the sink's write with it.
    from pytest_mailbox import _clock  # noqa: PLC0415 - after the real import of the plugin

    monkeypatch.setitem(sys.modules, "time_machine", _Travels(True, False))

    before, now, after = time.time(), _clock.wall(), time.time()

    assert before <= now <= after


def test_the_wall_clock_is_the_machine_s_when_a_travel_starts_during_its_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A travel to 1970 started between the look and time.time(), which read the travel's
    # time: the store took it for the machine's.
    from pytest_mailbox import _clock  # noqa: PLC0415

    monkeypatch.setitem(sys.modules, "time_machine", _Travels(False, True))
    monkeypatch.setattr(_clock, "_REAL", (lambda: 0.0, *_clock._REAL[1:]))

    before, now, after = time.time(), _clock.wall(), time.time()

    assert before <= now <= after
