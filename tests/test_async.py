"""The async API: the same waiting steps as the sync one, awaited on the test's event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import smtplib
import sys
import threading
import warnings
from collections.abc import Callable
from email.message import EmailMessage
from typing import Any

import aiosmtplib
import anyio
import pytest

from pytest_mailbox import ContractError, Mailbox, MailSink, UnexpectedMessage, WaitTimeout
from pytest_mailbox import agent as agent_module
from pytest_mailbox.agent import AgentTools


def _mail(to: str, subject: str) -> EmailMessage:
    mail = EmailMessage()
    mail["From"] = "noreply@app.example.test"
    mail["To"] = to
    mail["Subject"] = subject
    mail.set_content("Enter 271828 to continue.")
    return mail


async def _app_sends(server: MailSink, to: str, subject: str, started: asyncio.Event) -> None:
    """The app: another task on the same loop, which can only run while the test awaits."""
    started.set()
    await aiosmtplib.send(_mail(to, subject), hostname=server.host, port=server.port)


@pytest.mark.asyncio
async def test_awaits_its_message_while_the_app_sends_from_another_task(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    started = asyncio.Event()
    sender = asyncio.create_task(
        _app_sends(mailbox_server, isolated_mailbox.address, "Your sign-in code", started)
    )
    assert not started.is_set()  # the app task has not run: it needs the loop to be free
    msg = await isolated_mailbox.wait_for_async(subject_contains="sign-in", timeout=10)
    await sender
    assert started.is_set()
    assert msg.code() == "271828"
    msg.ack()
    assert isolated_mailbox.state == "consumed"


@pytest.mark.asyncio
async def test_async_timeout_lists_near_misses(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    await aiosmtplib.send(
        _mail(isolated_mailbox.address, "Welcome"),
        hostname=mailbox_server.host,
        port=mailbox_server.port,
    )
    with pytest.raises(WaitTimeout) as info:
        await isolated_mailbox.wait_for_async(subject_contains="Verify", timeout=0.2)
    assert "subject does not contain 'Verify'" in str(info.value)


@pytest.mark.asyncio
async def test_expect_none_async_sees_mail_sent_during_the_window(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    started = asyncio.Event()
    sender = asyncio.create_task(
        _app_sends(mailbox_server, isolated_mailbox.address, "Unexpected", started)
    )
    with pytest.raises(UnexpectedMessage, match="'Unexpected'"):
        await isolated_mailbox.expect_none_async(within=30)
    await sender


@pytest.mark.asyncio
async def test_expect_none_async_passes_on_silence(isolated_mailbox: Mailbox) -> None:
    await isolated_mailbox.expect_none_async(within=0.1)
    assert isolated_mailbox.state == "reserved"


@pytest.mark.asyncio
async def test_a_blocking_wait_in_an_async_test_says_to_await_the_async_one(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    started = asyncio.Event()
    sender = asyncio.create_task(
        _app_sends(mailbox_server, isolated_mailbox.address, "Your sign-in code", started)
    )
    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(timeout=0.2)  # the app's task cannot run meanwhile
    assert not started.is_set()
    assert "use `await isolated_mailbox.wait_for_async(...)`" in str(info.value)
    await sender
    assert (await isolated_mailbox.wait_for_async(timeout=10)).code() == "271828"


def test_a_blocking_wait_outside_a_loop_gives_no_async_advice(isolated_mailbox: Mailbox) -> None:
    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(timeout=0.01)
    assert "wait_for_async" not in str(info.value)


@pytest.mark.asyncio
async def test_agent_tools_acall_waits_while_the_app_sends_from_another_task(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    tools = isolated_mailbox.agent_tools()
    started = asyncio.Event()
    sender = asyncio.create_task(
        _app_sends(mailbox_server, isolated_mailbox.address, "Your sign-in code", started)
    )
    wait = {"fixture_id": isolated_mailbox.mailbox_id, "kind": "code", "timeout": 10}

    answer = await tools.acall("wait_for_message", wait)

    await sender
    assert started.is_set()
    assert (answer["status"], answer["kind"]) == ("waiting", "code")
    assert answer["next_action"] == {"do": "call", "tool": "claim_message"}


@pytest.mark.asyncio
async def test_a_blocking_agent_wait_on_the_loop_tells_its_author_to_use_acall(
    isolated_mailbox: Mailbox, caplog: pytest.LogCaptureFixture
) -> None:
    tools = isolated_mailbox.agent_tools()
    wait = {"fixture_id": isolated_mailbox.mailbox_id, "kind": "code", "timeout": 0.05}

    with caplog.at_level(logging.WARNING, logger="pytest_mailbox.agent"):
        answer = tools.call("wait_for_message", wait)

    assert answer["status"] == "waiting"  # found nothing: the agent sees no more than that
    assert "blocks that loop" in caplog.text
    assert "use `await tools.acall(...)`, which leaves the loop free" in caplog.text


def _app_sends_blocking(server: MailSink, to: str, subject: str) -> None:
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.send_message(_mail(to, subject))


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_the_async_api_runs_on_either_anyio_backend(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, anyio_backend: str
) -> None:
    tools = isolated_mailbox.agent_tools()
    box = (mailbox_server, isolated_mailbox.address)
    wait = {"fixture_id": isolated_mailbox.mailbox_id, "kind": "code", "timeout": 10}

    async with anyio.create_task_group() as app:
        app.start_soon(anyio.to_thread.run_sync, _app_sends_blocking, *box, "Your sign-in code")
        answer = await tools.acall("wait_for_message", wait)
        msg = await isolated_mailbox.wait_for_async(subject_contains="sign-in", timeout=10)

    assert (answer["status"], answer["kind"]) == ("waiting", "code")
    assert msg.code() == "271828"
    msg.ack()
    await isolated_mailbox.expect_none_async(within=0.05)
    async with anyio.create_task_group() as app:
        app.start_soon(anyio.to_thread.run_sync, _app_sends_blocking, *box, "Code, again")
        with pytest.raises(UnexpectedMessage):
            await isolated_mailbox.expect_none_async(within=10, subject_contains="again")


def test_the_async_api_outside_asyncio_and_trio_says_what_to_call(
    isolated_mailbox: Mailbox,
) -> None:
    waits = [
        isolated_mailbox.wait_for_async(timeout=1),
        isolated_mailbox.expect_none_async(within=1),
        isolated_mailbox.agent_tools().acall("wait_for_message", {}),
    ]
    for wait in waits:  # driven by hand: no event loop of any library runs here
        with pytest.raises(ContractError) as info:
            wait.send(None)
        assert str(info.value) == (
            "the async API (wait_for_async, expect_none_async, AgentTools.acall) runs on "
            "asyncio or trio (pytest-asyncio, anyio with either backend), and neither runs "
            "here; call wait_for, expect_none or call instead"
        )


def _last_entry(tools: AgentTools) -> tuple[list[str], str]:
    entry = tools.evidence()[-1]
    return entry.steps, entry.status


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_cancelled_acall_stops_its_wait_and_its_evidence_says_cancelled(
    isolated_mailbox: Mailbox, anyio_backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cancelled ``acall`` went on waiting in its thread until its timeout (on trio, the
    cancel itself waited for it): it stops at once now, claims nothing, and its cancel is
    raised once the call's thread is back, with the evidence written."""
    tools = isolated_mailbox.agent_tools()
    entered = threading.Event()
    call = tools._call

    def enters(*args: Any) -> tuple[dict[str, Any], Callable[[], None]]:
        entered.set()
        return call(*args)

    monkeypatch.setattr(tools, "_call", enters)
    wait = {"fixture_id": isolated_mailbox.mailbox_id, "kind": "code", "timeout": 60}

    async with anyio.create_task_group() as calls:
        calls.start_soon(tools.acall, "wait_for_message", wait)
        await anyio.to_thread.run_sync(entered.wait)  # the call is in its thread
        calls.cancel_scope.cancel()

    # The cancel was raised only once the call was back: its evidence is all written.
    assert _last_entry(tools) == (["proposed", "allowed", "cancelled"], "cancelled")
    assert isolated_mailbox.state != "claimed"


@pytest.mark.asyncio
async def test_an_acall_cancelled_once_its_call_was_back_says_its_answer_was_not_read(
    isolated_mailbox: Mailbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The call's thread was back, but its task was cancelled before it read the answer:
    what the call did stands, and its evidence says the answer was not sent."""
    tools = isolated_mailbox.agent_tools()
    back = threading.Event()
    call = tools._call

    def returns(*args: Any) -> tuple[dict[str, Any], Callable[[], None]]:
        try:
            return call(*args)
        finally:
            back.set()

    monkeypatch.setattr(tools, "_call", returns)
    wait = {"fixture_id": isolated_mailbox.mailbox_id, "kind": "code", "timeout": 0}
    task = asyncio.ensure_future(tools.acall("wait_for_message", wait))
    await asyncio.sleep(0)  # one turn of the loop: the task hands the call to its thread
    back.wait()  # the loop is held: the task has not read the answer yet
    task.cancel()

    with pytest.raises(asyncio.CancelledError):
        await task

    assert _last_entry(tools) == (["proposed", "allowed", "executed", "cancelled"], "waiting")
    assert tools.evidence()[-1].reason is not None
    assert "the answer was not sent" in tools.evidence()[-1].reason


_QUEUED_CALL = """
import asyncio
import threading

import pytest
import trio
import trio.testing

from pytest_mailbox import agent

WAIT = {"kind": "code", "timeout": 60}


@pytest.mark.asyncio
async def test_asyncio(isolated_mailbox, monkeypatch):
    # acall's threads are the plugin's, made at its first call (none yet in this process):
    # one, which a first wait holds. Not the loop's default executor, which acall does
    # not use: a call made while its one thread was busy ran at once in the plugin's.
    monkeypatch.setattr(agent, "ACALL_THREADS", 1)
    tools = isolated_mailbox.agent_tools()
    wait = {"fixture_id": isolated_mailbox.mailbox_id, **WAIT}
    holder = asyncio.ensure_future(tools.acall("wait_for_message", wait))
    await asyncio.sleep(0)  # one turn: the holder's call is first in the one thread's queue
    task = asyncio.ensure_future(tools.acall("wait_for_message", wait))
    await asyncio.sleep(0)  # one turn: the task queues its call behind the busy thread
    task.cancel()
    await asyncio.sleep(0)  # one turn: the cancel drops the queued call
    with pytest.raises(asyncio.CancelledError):
        await task
    holder.cancel()  # its wait stops at once
    with pytest.raises(asyncio.CancelledError):
        await holder
    # The holder's call alone ran: the task's was dropped before a thread took it
    assert [e.steps for e in tools.evidence()] == [["proposed", "allowed", "cancelled"]]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_trio(isolated_mailbox, anyio_backend):
    tools = isolated_mailbox.agent_tools()
    trio.to_thread.current_default_thread_limiter().total_tokens = 1
    free = threading.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(trio.to_thread.run_sync, free.wait)  # holds the one token
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as calls:
            calls.start_soon(
                tools.acall, "wait_for_message",
                {"fixture_id": isolated_mailbox.mailbox_id, **WAIT},
            )
            await trio.testing.wait_all_tasks_blocked()  # it waits for a token
            calls.cancel_scope.cancel()
        free.set()
"""


def test_an_acall_cancelled_before_a_thread_took_it_is_not_waited_for(
    pytester: pytest.Pytester,
) -> None:
    """Every worker thread busy (asyncio's executor, trio's limiter), the call waited for
    one; cancelled there, it is dropped, never run: its cancel waited, for ever, for a
    thread that would never be back (the timeout here is a hang net only)."""
    pytester.makepyfile(_QUEUED_CALL)
    result = pytester.runpytest_subprocess("-n", "0", "-p", "no:cacheprovider", timeout=120)
    result.assert_outcomes(passed=2)


@pytest.mark.skipif(sys.platform == "win32", reason="no fork")
def test_an_acall_in_a_forked_child_runs_in_a_thread_of_the_child_s(
    isolated_mailbox: Mailbox,
) -> None:
    """acall's threads are the process's: a child that a test forks (multiprocessing, an
    app server) has none of its parent's, yet the pool it copied counted the idle ones as
    idle still and started none: every acall of the child waited for ever."""
    tools = isolated_mailbox.agent_tools()
    reserve = {"purpose": isolated_mailbox.purpose, "ttl": 60}
    assert asyncio.run(tools.acall("reserve_mailbox", reserve))["status"] == "reserved"
    told, said = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: a fork with threads
        pid = os.fork()
    if pid == 0:  # the child: its answer, or why it would wait for ever, down the pipe
        try:
            os.close(told)
            gone = [
                thread
                for pool in agent_module._acall_threads
                for thread in pool._threads  # the pool's own: a dead one is the parent's
                if not thread.is_alive()
            ]
            if gone:
                answer = {"parent_s_threads": len(gone)}
            else:
                answer = asyncio.run(tools.acall("reserve_mailbox", reserve))
            os.write(said, json.dumps(answer).encode())
        finally:
            os._exit(0)
    os.close(said)
    with os.fdopen(told) as pipe:
        text = pipe.read()
    os.waitpid(pid, 0)

    answer = json.loads(text)
    assert answer.get("status") == "reserved", answer
    assert answer["fixture_id"] == isolated_mailbox.mailbox_id
