"""Long runs, runs in a row and runs at once: what the plugin holds while a run goes on,
what it leaves behind, and what one run does to another on the same machine."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="counts /proc/self/fd and /proc/net/tcp"
)

#: What these tests' inner runs leave out: plugins that would change them (see conftest.py).
BLOCKED = ("-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry")

#: The app: sends one mail, then waits for the sink to close its end of the connection
#: (smtplib's quit() closes at once), so that no socket of the sink is still open when the
#: test counts them.
SEND_CONFTEST = """
import smtplib
from email.message import EmailMessage

import pytest


@pytest.fixture
def send(mailbox_server):
    def send(to, subject="Verify your account", token="t0k3n-A7k9Q2x8Zr5w"):
        msg = EmailMessage()
        msg["From"] = "noreply@app.example.test"
        msg["To"] = to
        msg["Subject"] = subject
        msg.set_content(f"Open https://app.example.test/verify?token={token}")
        smtp = smtplib.SMTP(mailbox_server.host, mailbox_server.port)
        try:
            smtp.send_message(msg)
            smtp.docmd("QUIT")
            assert smtp.sock.recv(1) == b""  # the sink closed its socket
        finally:
            smtp.close()
    return send
"""

#: Counted at the end of every cycle of ten tests (each cycle runs the same kinds of test in
#: the same order, so a run that holds nothing more as it goes counts the same each time).
#: The store's own files are not counted as descriptors: SQLite keeps the descriptor of a
#: connection closed while another holds a lock, and gives it to the next one it opens, so
#: their number moves by one with the timing; the connections are counted instead.
COUNTING_CONFTEST = """
import asyncio
import gc
import json
import os
import sqlite3
import threading

import pytest

from pytest_mailbox import store

store.CHECKPOINT_EVERY = 1  # the checkpointer's thread starts at the first commit
CYCLE = 10


def _sockets():
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # the descriptor listdir had open
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:["):-1])
    states = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as rows:
                lines = rows.read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[9] in inodes:  # TCP state, as /proc/net/tcp writes it: 0A is LISTEN
                states[fields[3]] = states.get(fields[3], 0) + 1
    return states


def _descriptors(store_path):
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += not target.startswith(str(store_path))
    return count


def _sessions():
    return [o for o in gc.get_objects() if type(o).__module__ == "pytest_mailbox.sink"
            and type(o).__qualname__ == "_Protocol"]


def _counts(store_path):
    # The socket of the test's last SMTP session is closed (send() saw it), and the sink's
    # loop ends the session's task at its next turns: counted once it has.
    wake = threading.Event()
    for _ in range(1000):  # ten seconds at most: a hang net
        gc.collect()
        if not _sessions():
            break
        wake.wait(0.01)
    objects = gc.get_objects()
    plugin_objects = {}
    for obj in objects:
        if type(obj).__module__.startswith("pytest_mailbox"):
            name = type(obj).__qualname__
            plugin_objects[name] = plugin_objects.get(name, 0) + 1
    return {
        "descriptors": _descriptors(store_path),
        "threads": sorted(t.name for t in threading.enumerate()),
        "tasks": len(os.listdir("/proc/self/task")),
        "sockets": _sockets(),
        "SQLite connections": sum(isinstance(o, sqlite3.Connection) for o in objects),
        "asyncio transports": sum(isinstance(o, asyncio.BaseTransport) for o in objects),
        "open event loops": sum(
            isinstance(o, asyncio.AbstractEventLoop) and not o.is_closed() for o in objects
        ),
        "plugin objects": plugin_objects,
    }


@pytest.fixture(autouse=True)
def counted(request, mailbox_store):
    yield  # torn down after the test's mailbox, which was set up after it
    if request.node.callspec.params["n"] % CYCLE == CYCLE - 1:
        worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
        counts = _counts(mailbox_store.path)
        with open(f"counts-{worker}.jsonl", "a") as out:
            out.write(json.dumps(counts) + "\\n")
"""

#: Every kind of test a long suite has, once a cycle: passes, failures, timeouts, the
#: agent's tools, async waits, waits from threads, scripted faults.
CYCLE_SUITE = """
import asyncio
import threading

import pytest

from conftest import CYCLE


@pytest.mark.email_contract(purpose="signup", ttl=60, lease=30, link_domains=["app.example.test"])
@pytest.mark.parametrize("n", range({cycles} * CYCLE))
def test_mail(isolated_mailbox, send, n):
    kind, address = n % CYCLE, isolated_mailbox.address
    if kind == 0:  # a scripted fault (through the sink's writer thread), then the mail
        isolated_mailbox.inject_fault(stage="RCPT")
        with pytest.raises(Exception, match="451"):
            send(address)
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify").ack()
    elif kind == 1:
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify").ack()
        pytest.fail("fails after its ack")
    elif kind == 2:
        isolated_mailbox.wait_for(subject_contains="never sent", timeout=0.01)
    elif kind == 3:
        send(address)
        tools = isolated_mailbox.agent_tools()
        fixture_id = tools.call("reserve_mailbox", {{"purpose": "signup", "ttl": 60}})["fixture_id"]
        tools.call("wait_for_message", {{"fixture_id": fixture_id, "kind": "link", "timeout": 10}})
        claim = tools.call("claim_message", {{"fixture_id": fixture_id, "selector": {{}}}})
        assert tools.reveal(claim["message_id"], domain="app.example.test")
        ack = {{"fixture_id": fixture_id, "fence": claim["fence"]}}
        ack["message_id"] = claim["message_id"]
        assert tools.call("ack_message", ack)["status"] == "consumed"
    elif kind == 4:
        send(address)
        isolated_mailbox.wait_for(subject_contains="Verify")
        raise RuntimeError("fails holding its claim")
    elif kind == 5:  # an event loop of its own: the awaited wait, and the agent's acall
        async def main():
            send(address)
            (await isolated_mailbox.wait_for_async(subject_contains="Verify")).ack()
            send(address, subject="Your code")
            tools = isolated_mailbox.agent_tools()
            reserved = await tools.acall("reserve_mailbox", {{"purpose": "signup", "ttl": 60}})
            selector = {{"fixture_id": reserved["fixture_id"], "selector": {{}}}}
            assert (await tools.acall("claim_message", selector))["status"] == "claimed"
        asyncio.run(main())
    elif kind == 6:  # a thread of its own: its connections close those of ended threads
        send(address)
        claimed = []
        waiter = threading.Thread(target=lambda: claimed.append(isolated_mailbox.wait_for()))
        waiter.start()
        waiter.join()
        claimed[0].ack()
    elif kind == 7:
        send(isolated_mailbox.tagged("friend"))
        isolated_mailbox.wait_for(tag="friend").ack()
        isolated_mailbox.expect_none(within=0.01)
    elif kind == 8:
        send(address)  # left unclaimed
    else:
        send(address, token="first-A7k9Q2x8Zr5w")
        send(address, subject="Welcome", token="second-B8m2R4y6Ws3v")
        isolated_mailbox.wait_for(subject_contains="Welcome").ack()
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_long_run_holds_as_much_at_its_end_as_after_its_first_cycle(
    pytester: pytest.Pytester, workers: str
) -> None:
    """Descriptors, threads, sockets, SQLite connections, event loops and their transports,
    and the plugin's own objects, counted in the process that runs the tests at the end of
    each cycle of ten kinds of test: the same at the fifth as at the second (the first
    starts what a run starts once: the sink, its writer thread, the checkpointer)."""
    processes = 1 if workers == "0" else 2
    pytester.makeconftest(SEND_CONFTEST + COUNTING_CONFTEST)
    for name in ("test_one", "test_two")[:processes]:  # a file a worker (--dist loadfile)
        pytester.makepyfile(**{name: CYCLE_SUITE.format(cycles=5)})
    result = pytester.runpytest_subprocess(
        *BLOCKED, "-p", "no:cacheprovider", "-W", "error", "-n", workers, "--dist", "loadfile"
    )
    result.assert_outcomes(passed=35 * processes, failed=15 * processes)
    files = sorted(pytester.path.glob("counts-*.jsonl"))
    assert len(files) == processes
    for file in files:
        counts = [json.loads(line) for line in file.read_text().splitlines()]
        assert len(counts) == 5
        after_warm_up = counts[1]
        assert after_warm_up["sockets"] == {"0A": 1}  # the sink's listener, and nothing else
        for later in counts[2:]:
            assert later == after_warm_up
