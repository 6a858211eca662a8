"""The shared store under hostile process conditions: kill -9, endless readers, contention.

Child processes are real interpreters working on the same SQLite file; the parent reads
their progress from a pipe, never from a sleep.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import smtplib
import socket
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from storekit import rows

import pytest_mailbox.store as store_module
from pytest_mailbox import EmailContract, Mailbox
from pytest_mailbox.errors import StoreError
from pytest_mailbox.sink import MailSink
from pytest_mailbox.store import (
    TRUNCATE_TRIES,
    WAL_CHECK_EVERY,
    Delivery,
    Incoming,
    MailboxRow,
    Store,
    StoreBusy,
)

SAFETY = 30.0  # seconds: an upper bound on waiting for a child, never a synchronisation


Child = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def child() -> Iterator[Child]:
    """Starts a Python script in a child process with piped stdio: ``child(script, *args)``.
    A test that fails midway leaves no child running and no pipe open (the next test on
    the worker would otherwise fail on the ResourceWarning of its collection)."""
    started: list[subprocess.Popen[str]] = []

    def start(script: str, *args: str) -> subprocess.Popen[str]:
        process = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(script), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        if process.poll() is None:
            process.kill()
        process.wait(SAFETY)
        closed(process)


def closed(process: subprocess.Popen[str]) -> None:
    for stream in (process.stdin, process.stdout, process.stderr):
        if stream is not None:
            stream.close()


def kill_9(process: subprocess.Popen[str]) -> None:
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(SAFETY) == -signal.SIGKILL
    closed(process)


def integrity(path: Path) -> str:
    return str(rows(path, "PRAGMA integrity_check")[0][0])


def deliver(store: Store, mailbox: MailboxRow, subject: str, body: bytes = b"hi") -> str:
    (message_id,) = store.deliver(
        mail_from="app@example.test",
        deliveries=[
            Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
        ],
        raw=b"Subject: %s\r\n\r\n%s\r\n" % (subject.encode(), body),
        subject=subject,
        run_header=None,
    )
    return message_id


def _incoming(mailbox: MailboxRow, subject: str, body: bytes) -> Incoming:
    rcpt = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
    raw = b"Subject: %s\r\n\r\n%s\r\n" % (subject.encode(), body)
    return Incoming("app@example.test", [rcpt], raw, subject, None, ())


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    handle = Store(tmp_path / "store.sqlite3")
    yield handle
    handle.close()


@pytest.fixture
def mailbox(store: Store) -> MailboxRow:
    row, _ = store.reserve(run_id="r-hardening", purpose="hard", ttl=600, domain="mailbox.test")
    return row


HOLD_A_WRITE = """
    import sys
    from pytest_mailbox.store import Store

    store = Store(sys.argv[1])
    with store._write() as tx:
        tx.run("INSERT INTO bodies (raw) VALUES (?)", (b"never committed",))
        print("inside the write transaction", flush=True)
        sys.stdin.readline()  # killed here, holding the write lock
"""


def test_kill_9_inside_a_write_transaction_leaves_the_store_usable(
    store: Store, mailbox: MailboxRow, child: Child
) -> None:
    before = deliver(store, mailbox, "before the crash")
    holder = child(HOLD_A_WRITE, str(store.path))
    assert holder.stdout is not None
    assert holder.stdout.readline() == "inside the write transaction\n"
    # A writer of this process queues behind the lock the child holds.
    delivered: list[str] = []
    waiter = threading.Thread(
        target=lambda: delivered.append(deliver(store, mailbox, "while it held the lock"))
    )
    waiter.start()

    kill_9(holder)
    waiter.join(SAFETY)

    assert not waiter.is_alive()
    after = deliver(store, mailbox, "after the crash")
    assert integrity(store.path) == "ok"
    assert [m.message_id for m in store.messages(mailbox.mailbox_id)] == [
        before,
        *delivered,
        after,
    ]
    leftovers = rows(store.path, "SELECT COUNT(*) FROM bodies WHERE raw = ?", (b"never committed",))
    assert leftovers == [(0,)]


RUN_A_SINK = """
    import sys
    from pytest_mailbox.sink import MailSink
    from pytest_mailbox.store import Store

    sink = MailSink(Store(sys.argv[1]), domains=["mailbox.test"], name="doomed").start()
    print(sink.port, flush=True)
    sys.stdin.readline()
"""


def test_kill_9_of_a_sink_process_loses_no_accepted_message(
    store: Store, mailbox: MailboxRow, child: Child
) -> None:
    process = child(RUN_A_SINK, str(store.path))
    assert process.stdout is not None
    port = int(process.stdout.readline())
    accepted = []
    with smtplib.SMTP("127.0.0.1", port, timeout=SAFETY) as smtp:
        for n in range(20):
            subject = f"accepted {n}"
            smtp.sendmail("app@example.test", [mailbox.address], f"Subject: {subject}\r\n\r\nhi")
            accepted.append(subject)  # sendmail returned: the sink answered 250
    # A large message, killed while the sink parses or writes it.
    with (
        socket.create_connection(("127.0.0.1", port), timeout=SAFETY) as raw,
        raw.makefile("rb") as reader,
    ):
        assert reader.readline().startswith(b"220")
        for line in (b"HELO x", b"MAIL FROM:<app@example.test>", f"RCPT TO:<{mailbox.address}>"):
            raw.sendall((line if isinstance(line, bytes) else line.encode()) + b"\r\n")
            assert reader.readline().startswith(b"250")
        raw.sendall(b"DATA\r\n")
        assert reader.readline().startswith(b"354")
        raw.sendall(b"Subject: in flight\r\n\r\n" + (b"0123456789abcdef" * 62 + b"\r\n") * 2000)
        raw.sendall(b".\r\n")

        kill_9(process)

    assert integrity(store.path) == "ok"
    subjects = [m.subject for m in store.messages(mailbox.mailbox_id)]
    assert [s for s in subjects if s != "in flight"] == accepted
    assert subjects.count("in flight") <= 1
    # Another sink takes over the same store at once.
    with (
        MailSink(store, domains=["mailbox.test"], name="survivor") as survivor,
        smtplib.SMTP(survivor.host, survivor.port, timeout=SAFETY) as smtp,
    ):
        smtp.sendmail("app@example.test", [mailbox.address], "Subject: survivor\r\n\r\nhi")
    assert store.messages(mailbox.mailbox_id)[-1].subject == "survivor"


@pytest.mark.parametrize("wait", [True, False], ids=["waiting-writer", "sink-event-loop"])
def test_wal_stays_bounded_while_readers_never_pause(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wait: bool
) -> None:
    """Bounded whether the writer truncates the log itself (a test's write) or leaves it to
    the background checkpointer (the sink's event loop: ``wait=False``, then its writer
    thread when the lock is taken), which must wait for the readers to leave the log."""
    # The writer finds a gap between the readers' reads within a dozen tries, but a loaded
    # machine stretches the wall time those take (longest 0.08 s idle, 0.5 s beside eight
    # busy loops): a patience of 1 s spent in vain starts a back-off, and the log grows
    # during it. That is _in_a_back_off's subject; here the patience never runs out first.
    monkeypatch.setattr(store_module, "TRUNCATE_PATIENCE", SAFETY)
    limit = 1024 * 1024
    writer = Store(tmp_path / "store.sqlite3", wal_limit=limit)
    reader = Store(tmp_path / "store.sqlite3")  # one connection per reading thread
    mailbox, _ = writer.reserve(run_id="r-wal", purpose="wal", ttl=600, domain="mailbox.test")
    done = threading.Event()
    reads = [0, 0]

    def read(slot: int) -> None:  # what a waiter does, without ever pausing
        while not done.is_set():
            reader.data_version()
            reader.messages(mailbox.mailbox_id)
            reader.checkpoint()
            reads[slot] += 1

    threads = [threading.Thread(target=read, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    largest = 0
    body = b"x" * 16384
    try:
        for n in range(1600):  # 26 MB of messages, 26 times the limit
            incoming = _incoming(mailbox, f"m{n}", body)
            try:
                writer.deliver_all([incoming], wait=wait)
            except StoreBusy:  # what the sink does: its writer thread waits for the lock
                writer.deliver_all([incoming])
            largest = max(largest, Path(f"{writer.path}-wal").stat().st_size)
    finally:
        done.set()
        for thread in threads:
            thread.join(SAFETY)

    assert min(reads) > 0  # the readers really overlapped the writes
    # Bounded by the limit, plus what is written while another checkpointer (the store's
    # background one) holds the checkpoint lock; without the bound it grows with the data.
    assert largest <= 5 * limit
    assert len(writer.messages(mailbox.mailbox_id)) == 1600
    assert integrity(writer.path) == "ok"
    reader.close()
    writer.close()


CONTEND = """
    import json, sys
    from pytest_mailbox.contract import CloseReason, Status
    from pytest_mailbox.store import Delivery, Store

    path, me, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
    store = Store(path)
    print("ready", flush=True)
    sys.stdin.readline()  # every child starts together
    for n in range(rounds):
        row, _ = store.reserve(run_id=f"{me}-{n}", purpose="race", ttl=60, domain="mailbox.test")
        assert store.mark(row.mailbox_id, row.fence, Status.WAITING) is None
        (mid,) = store.deliver(
            mail_from="a@example.test",
            deliveries=[Delivery(rcpt=row.address, alias=row.alias, tag=None, domain=row.domain)],
            raw=b"Subject: x\\r\\n\\r\\nhi\\r\\n", subject="x", run_header=None,
        )
        claimed = store.claim(mailbox_id=row.mailbox_id, mailbox_fence=row.fence,
                              message_id=mid, holder=row.run_id, lease=30)
        assert claimed.status is Status.CLAIMED, claimed
        assert store.ack(mid, claimed.fence).status is Status.CONSUMED
        released = store.release(row.mailbox_id, row.fence, CloseReason.RELEASED_SUCCESS)
        assert released.status is Status.RELEASED, released
        store.reconcile()
        assert store.mailbox(row.mailbox_id).state == "released"
    # Then everybody races for the same shared messages.
    shared = json.loads(sys.argv[4])
    won = []
    for mailbox_id, fence, message_id in shared:
        outcome = store.claim(mailbox_id=mailbox_id, mailbox_fence=fence,
                              message_id=message_id, holder=me, lease=30)
        assert outcome.status in (Status.CLAIMED, Status.ALREADY_CLAIMED), outcome
        if outcome.status is Status.CLAIMED:
            won.append([message_id, outcome.fence])
    print(json.dumps(won), flush=True)
"""


def test_read_then_write_paths_never_hit_database_is_locked(store: Store, child: Child) -> None:
    shared = []
    for n in range(30):
        row, _ = store.reserve(run_id=f"shared-{n}", purpose="race", ttl=600, domain="mailbox.test")
        shared.append([row.mailbox_id, row.fence, deliver(store, row, f"shared {n}")])
    children = [
        child(CONTEND, str(store.path), f"p{i}", "25", json.dumps(shared)) for i in range(4)
    ]
    for process in children:
        assert process.stdout is not None
        assert process.stdout.readline() == "ready\n"
    for process in children:
        assert process.stdin is not None
        process.stdin.write("go\n")
        process.stdin.flush()

    results = [process.communicate(timeout=SAFETY * 4) for process in children]

    for process, (_, err) in zip(children, results, strict=True):
        assert process.returncode == 0, err
        assert "database is locked" not in err
    won = [claim for out, _ in results for claim in json.loads(out.splitlines()[-1])]
    assert sorted(message_id for message_id, _ in won) == sorted(m for _, _, m in shared)
    fences = [fence for _, fence in won]
    assert len(set(fences)) == len(fences)
    counts = store.stats()
    assert counts["consumed"] == 4 * 25
    assert counts["claimed"] == 4 * 25 + 30
    assert integrity(store.path) == "ok"


@pytest.mark.parametrize("wait", [True, False])
def test_a_writer_that_cannot_get_the_lock_gives_up_and_changes_nothing(
    tmp_path: Path, wait: bool
) -> None:
    store = Store(tmp_path / "store.sqlite3", busy_timeout=0.05)
    mailbox, _ = store.reserve(run_id="r-lock", purpose="lock", ttl=600, domain="mailbox.test")
    delivery = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
    message = Incoming("app@example.test", [delivery], b"Subject: s\r\n\r\nhi\r\n", "s", None)
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock

    # Waiting gives up after busy_timeout, saying what holds it; not waiting says so at once.
    with pytest.raises(StoreError if wait else StoreBusy, match="locked") as refused:
        store.deliver_all([message], wait=wait)
    if wait:
        assert str(refused.value) == (
            f"the store {store.path} stayed locked by another connection for its whole "
            "busy_timeout of 0.05s: a process stopped (a debugger, SIGSTOP) or hung inside "
            "a write transaction holds it"
        )
        assert isinstance(refused.value.__cause__, sqlite3.OperationalError)

    holder.execute("ROLLBACK")
    holder.close()
    assert store.messages(mailbox.mailbox_id) == []
    assert store.deliver_all([message], wait=False)  # and the same handle writes afterwards
    store.close()


def first_pause(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Set when a writer of this process first pauses for a write lock held elsewhere."""
    paused = threading.Event()
    pauses = store_module._pauses

    def signalled(*args: float) -> Iterator[None]:
        for pause in pauses(*args):
            paused.set()
            yield pause

    monkeypatch.setattr(store_module, "_pauses", signalled)
    return paused


@pytest.mark.parametrize("write", ["deliver_all", "take_fault"])
def test_a_writer_waiting_for_the_lock_stops_when_told_and_changes_nothing(
    store: Store, mailbox: MailboxRow, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """What a sink's writer thread does at stop(): busy_timeout (60 s) is not waited out."""
    store.add_fault(mailbox.mailbox_id, mailbox.fence, stage="DATA", reply="451 4.3.0 x", times=1)
    delivery = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
    message = Incoming("app@example.test", [delivery], b"Subject: s\r\n\r\nhi\r\n", "s", None)
    give_up = threading.Event()
    calls: dict[str, Callable[[], object]] = {
        "deliver_all": lambda: store.deliver_all([message], give_up=give_up),
        "take_fault": lambda: store.take_fault(
            mailbox.alias, mailbox.domain, "DATA", give_up=give_up
        ),
    }
    paused = first_pause(monkeypatch)
    raised: list[BaseException] = []

    def run() -> None:
        try:
            calls[write]()
        except BaseException as exc:  # handed to the test's thread
            raised.append(exc)

    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    writer = threading.Thread(target=run)
    writer.start()
    assert paused.wait(SAFETY)  # the writer met the lock and waits for it

    give_up.set()
    writer.join(SAFETY)
    stopped = not writer.is_alive()
    holder.execute("ROLLBACK")
    holder.close()
    writer.join(SAFETY)

    assert stopped
    assert [type(exc) for exc in raised] == [StoreBusy]
    assert store.messages(mailbox.mailbox_id) == []
    assert store.fault_pending(mailbox.alias, mailbox.domain, "DATA") is not None  # not taken


def test_stop_gives_up_a_message_waiting_for_another_process_and_its_client_gets_no_250(
    store: Store, mailbox: MailboxRow, monkeypatch: pytest.MonkeyPatch
) -> None:
    """stop() waited for the sink's writer thread, which waited up to busy_timeout (60 s)
    for the lock; and a message committed after its client was cut off came twice when
    the client sent it again."""
    paused = first_pause(monkeypatch)
    sink = MailSink(store, domains=["mailbox.test"]).start()
    holder = sqlite3.connect(store.path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process holds the write lock
    stopping = threading.Thread(target=sink.stop)
    try:
        with smtplib.SMTP(sink.host, sink.port, timeout=SAFETY) as smtp:
            smtp.ehlo()
            smtp.mail("app@example.test")
            smtp.rcpt(mailbox.address)
            assert smtp.docmd("DATA")[0] == 354
            smtp.send(b"Subject: held\r\n\r\nhi\r\n.\r\n")
            assert paused.wait(SAFETY)  # the sink's commit waits for the lock

            stopping.start()
            stopping.join(SAFETY)
            stopped = not stopping.is_alive()
            try:
                code: int | None = smtp.getreply()[0]
            except smtplib.SMTPServerDisconnected:
                code = None
    finally:
        holder.execute("ROLLBACK")
        holder.close()
        sink.stop()
        if stopping.is_alive():
            stopping.join(SAFETY)

    assert stopped  # while the other process still held the lock
    assert code is None or 400 <= code < 500  # the client still owns the message
    assert store.messages(mailbox.mailbox_id) == []
    assert rows(store.path, "SELECT COUNT(*) FROM bodies") == [(0,)]  # nothing half-stored
    # It sends the message again: stored once.
    with (
        MailSink(store, domains=["mailbox.test"]) as again,
        smtplib.SMTP(again.host, again.port, timeout=SAFETY) as smtp,
    ):
        smtp.sendmail("app@example.test", [mailbox.address], b"Subject: held\r\n\r\nhi\r\n")
    assert [m.subject for m in store.messages(mailbox.mailbox_id)] == ["held"]


def restarts(wal: Path) -> int:
    """How many times the log was started over (truncated, or restarted): the checkpoint
    sequence number in its header. A write that may wait truncates a log past the limit
    before its own transaction, so the log then holds that write alone."""
    header = wal.read_bytes()[:16]
    return int.from_bytes(header[12:16], "big") if len(header) == 16 else 0


def _bigger_than_the_log(tmp_path: Path, limit: int) -> tuple[Store, Incoming, Path]:
    """A store whose log may hold ``limit`` bytes, a message to one of its mailboxes that is
    bigger than that, and the log's path."""
    store = Store(tmp_path / "store.sqlite3", wal_limit=limit)
    mailbox, _ = store.reserve(run_id="r-big", purpose="big", ttl=600, domain="mailbox.test")
    delivery = Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
    big = Incoming(
        "app@example.test", [delivery], b"Subject: big\r\n\r\n" + b"x" * limit, "big", None
    )
    return store, big, Path(f"{store.path}-wal")


def test_a_commit_that_must_not_wait_leaves_the_log_to_a_writer_that_may(
    tmp_path: Path,
) -> None:
    """The sink's event loop never truncates the log (a checkpoint there can take tens of
    ms). Once its store handle has seen the log past the limit, it refuses to commit, so
    the sink hands the message to its writer thread, which may wait: that commit
    truncates the log, and the loop commits again. (A background checkpointer cannot
    truncate it beside a writer that never stops: SQLite's busy handler sleeps 1 ms, and
    loses the write lock to it every time.)"""
    limit = 256 * 1024
    store, big, wal = _bigger_than_the_log(tmp_path, limit)
    refused: list[str] = []
    committed = 0
    for _ in range(WAL_CHECK_EVERY + 1):  # the handle looks at the log's size every few
        try:  # commits: until then, the loop commits
            store.deliver_all([big], wait=False)
        except StoreBusy as exc:
            refused.append(str(exc))
            break
        committed += 1
    assert refused == ["the write-ahead log is past wal_limit: a writer that may wait truncates it"]
    assert 1 <= committed <= WAL_CHECK_EVERY
    assert wal.stat().st_size > limit  # not truncated on the caller's thread

    started = restarts(wal)
    store.deliver_all([big])  # the sink's writer thread
    assert restarts(wal) == started + 1
    store.deliver_all([big], wait=False)
    [(stored,)] = rows(store.path, "SELECT count(*) FROM messages")
    assert stored == committed + 2  # the refused one was not stored
    store.close()


def test_a_writer_looks_at_the_log_size_once_every_few_commits(
    tmp_path: Path,
) -> None:
    store, big, wal = _bigger_than_the_log(tmp_path, 64 * 1024)
    seen = []
    for _ in range(2 * WAL_CHECK_EVERY):
        store.deliver_all([big])  # a waiting writer: it truncates when it sees the limit passed
        seen.append(restarts(wal))
    store.close()

    # Past the limit after every commit, truncated only after the commits that looked.
    truncated = [n for n in range(1, len(seen)) if seen[n] > seen[n - 1]]
    assert len(truncated) == 2
    assert truncated[1] - truncated[0] == WAL_CHECK_EVERY


def test_no_connection_syncs_and_the_checkpointer_never_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every connection the store opens has ``synchronous=OFF`` (``NORMAL`` synced the file
    twice at every checkpoint: a commit is visible to every process, and safe from a crash
    of this one, once the operating system has it). The background checkpointer's waits
    for a lock ``RESTART_HOLD`` at most (1 ms): its RESTART waits for readers holding the
    write lock, and every writer waits with it (it waited up to 1 s)."""
    seen: list[tuple[str, int, int]] = []
    real = store_module._connect

    def spy(path: Path, *, timeout: float) -> sqlite3.Connection:
        conn = real(path, timeout=timeout)
        (sync,) = conn.execute("PRAGMA synchronous").fetchone()
        (busy,) = conn.execute("PRAGMA busy_timeout").fetchone()
        seen.append((threading.current_thread().name, sync, busy))
        return conn

    monkeypatch.setattr(store_module, "_connect", spy)
    store = Store(tmp_path / "store.sqlite3", busy_timeout=60.0)
    store.reserve(run_id="r-1", purpose="mail", ttl=60, domain="mailbox.test")
    store.checkpoint()  # a read: the reader's connection
    store._checkpointer_for().request()
    store.close()  # joins the checkpointer

    assert {sync for _, sync, _ in seen} == {0}
    # The test's writer and reader, then the checkpointer's.
    waits = sorted((name, timeout) for name, _, timeout in seen)
    assert waits == [("MainThread", 0), ("MainThread", 60_000), ("pytest-mailbox-checkpoint", 1)]


def _in_a_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, limit: int
) -> tuple[Store, Incoming, Path, sqlite3.Connection]:
    """``_bigger_than_the_log``'s store, with a reader that holds a snapshot (the last
    item, still in its transaction) and a writer that waited in vain to truncate the log:
    a back-off that never runs out has begun."""
    monkeypatch.setattr(store_module, "TRUNCATE_PATIENCE", 0.05)
    monkeypatch.setattr(store_module, "TRUNCATE_BACKOFF", 3600.0)
    store, big, wal = _bigger_than_the_log(tmp_path, limit)
    pinned = sqlite3.connect(store.path, isolation_level=None)
    pinned.execute("BEGIN")
    pinned.execute("SELECT count(*) FROM messages").fetchone()  # a snapshot, held
    for _ in range(WAL_CHECK_EVERY):  # a waiting writer looks at the log within these
        store.deliver_all([big])
    return store, big, wal, pinned


def test_a_reader_that_never_lets_go_costs_log_growth_not_a_wait_per_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read transaction held open pins the log: no checkpoint can truncate it until it
    ends. Once a writer's patience is spent in vain, no one waits to truncate for a while
    (``TRUNCATE_BACKOFF``) and the sink's event loop commits again: the log grows instead of
    every message waiting a second, or going through the writer thread, for nothing."""
    limit = 64 * 1024
    store, big, wal, pinned = _in_a_back_off(tmp_path, monkeypatch, limit)

    store.deliver_all([big], wait=False)  # not refused: nobody could truncate
    assert wal.stat().st_size > limit
    pinned.execute("COMMIT")
    pinned.close()
    monkeypatch.setattr(store, "_truncate_after", -math.inf)  # the back-off is over
    started = restarts(wal)
    store.deliver_all([big])
    assert restarts(wal) == started + 1
    store.close()


def test_the_log_is_truncated_soon_after_the_reader_lets_go_even_during_a_back_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """During a back-off no writer waits, but every WAL_CHECK_EVERY-th commit still tries
    once: a reader that let go no longer leaves the log growing for the back-off's rest
    (up to a minute, beside waiters that never pause)."""
    limit = 64 * 1024
    store, big, wal, pinned = _in_a_back_off(tmp_path, monkeypatch, limit)
    assert wal.stat().st_size > limit
    pinned.execute("COMMIT")
    pinned.close()

    started = restarts(wal)
    for _ in range(2 * WAL_CHECK_EVERY):  # one try in every WAL_CHECK_EVERY, and retries
        store.deliver_all([big])

    assert restarts(wal) > started  # truncated before one of these commits
    store.close()


def test_a_writer_tries_a_number_of_times_to_truncate_however_slow_the_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A writer's patience was counted in seconds alone: where a second held fewer tries
    than it takes to land in a busy reader's gap (a loaded CI machine), it backed off, and
    the log grew for the rest of the run. Here no time at all is given: the tries are."""
    monkeypatch.setattr(store_module, "TRUNCATE_PATIENCE", 0.0)
    limit = 64 * 1024
    store, big, wal = _bigger_than_the_log(tmp_path, limit)
    pinned = sqlite3.connect(store.path, isolation_level=None)
    pinned.execute("BEGIN")
    pinned.execute("SELECT count(*) FROM messages").fetchone()  # the reader in the way
    made = 0
    truncated = store._truncated

    def tries(conn: sqlite3.Connection) -> bool:
        nonlocal made
        made += 1
        if made == TRUNCATE_TRIES // 2:  # the reader leaves, between two of the tries
            pinned.execute("COMMIT")
        return truncated(conn)

    monkeypatch.setattr(store, "_truncated", tries)
    started = restarts(wal)
    for _ in range(WAL_CHECK_EVERY):  # a waiting writer looks at the log within these
        store.deliver_all([big])

    assert made == TRUNCATE_TRIES // 2  # in vain until the reader left, then truncated
    assert restarts(wal) == started + 1
    assert store._truncate_after == -math.inf  # and no back-off began
    pinned.close()
    store.close()


def test_a_write_truncates_the_log_before_it_reads_the_clock_not_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reservation's ttl and a claim's lease run from the clock read in their transaction.
    Truncating the log after the commit (up to TRUNCATE_PATIENCE, with a reader in the
    way) came off what they granted: a reserve(ttl=1) returned an expired mailbox."""
    limit = 64 * 1024
    store, _, _, pinned = _in_a_back_off(tmp_path, monkeypatch, limit)
    monkeypatch.setattr(store, "_truncate_after", -math.inf)  # a writer waits again
    steps: list[str] = []
    truncated = store._truncated

    def tries(conn: sqlite3.Connection) -> bool:
        steps.append("truncate")
        return truncated(conn)

    monkeypatch.setattr(store, "_truncated", tries)
    monkeypatch.setattr(store, "clock", lambda: steps.append("clock") or time.time())

    store.reserve(run_id="r-late", purpose="signup", ttl=1, domain="mailbox.test")

    assert "truncate" in steps  # the reader held the log: it tried, in vain, for a while
    assert steps[-1] == "clock"  # and only then began the reservation
    pinned.execute("COMMIT")
    pinned.close()
    store.close()


def test_an_interrupt_inside_a_write_rolls_it_back_and_passes_through(tmp_path: Path) -> None:
    """Ctrl-C, or pytest-timeout's signal, landing inside a write: not a StoreError (the
    store did not fail), nothing stored, and the connection left out of the transaction."""

    def clock() -> float:
        raise KeyboardInterrupt

    store = Store(tmp_path / "store.sqlite3", clock=clock)
    with pytest.raises(KeyboardInterrupt):
        store.reserve(run_id="r-1", purpose="signup", ttl=60, domain="mailbox.test")
    assert not store._conn(writer=True).in_transaction
    assert rows(store.path, "SELECT count(*) FROM mailboxes") == [(0,)]
    store.close()


class _InterruptedAsBeginReturns:
    """A store's writer connection on which Ctrl-C (or pytest-timeout's signal) lands just
    as ``BEGIN IMMEDIATE`` returns: Python raises it at the next instruction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def execute(self, sql: str, *args: Any) -> sqlite3.Cursor:
        cursor = self.conn.execute(sql, *args)
        if sql == "BEGIN IMMEDIATE":
            raise KeyboardInterrupt
        return cursor

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_an_interrupt_as_a_write_begins_leaves_no_transaction_holding_the_store(
    tmp_path: Path,
) -> None:
    """The BEGIN was outside the try that rolls back: the connection stayed in its write
    transaction, and every other process's writes waited for it, then failed."""
    store = Store(tmp_path / "store.sqlite3")
    writer = store._conn(writer=True)
    store._local.writer = _InterruptedAsBeginReturns(writer)
    with pytest.raises(KeyboardInterrupt):
        store.reserve(run_id="r-1", purpose="signup", ttl=60, domain="mailbox.test")
    store._local.writer = writer

    assert not writer.in_transaction
    with Store(store.path, busy_timeout=0.05) as other:  # another worker's, say
        other.reserve(run_id="r-2", purpose="signup", ttl=60, domain="mailbox.test")
    store.reserve(run_id="r-3", purpose="signup", ttl=60, domain="mailbox.test")
    assert rows(store.path, "SELECT run_id FROM mailboxes ORDER BY run_id") == [
        ("r-2",),
        ("r-3",),
    ]
    store.close()


def test_a_transaction_no_write_holds_is_ended_by_the_next_write(tmp_path: Path) -> None:
    """A second interrupt, landing on the rollback of an interrupted write, leaves its
    transaction open with no write holding it: the next write ends it, rather than fail
    on it for ever while every other process waits for the lock it holds."""
    store = Store(tmp_path / "store.sqlite3")
    store._conn(writer=True).execute("BEGIN IMMEDIATE")  # left open, as such a rollback leaves it

    store.reserve(run_id="r-1", purpose="signup", ttl=60, domain="mailbox.test")
    with Store(store.path, busy_timeout=0.05) as other:  # another worker's, say
        other.reserve(run_id="r-2", purpose="signup", ttl=60, domain="mailbox.test")

    assert rows(store.path, "SELECT run_id FROM mailboxes ORDER BY run_id") == [
        ("r-1",),
        ("r-2",),
    ]
    store.close()


def test_a_write_refused_inside_a_write_leaves_the_outer_one_to_its_owner(
    tmp_path: Path,
) -> None:
    """The refused BEGIN is inside the try that rolls back (for an interrupt): it must not
    roll back the transaction it found open, whose statements would then commit one by
    one, and whose COMMIT would fail."""
    store = Store(tmp_path / "store.sqlite3")
    with store._write() as tx:
        tx.run("INSERT INTO bodies (raw) VALUES (?)", (b"one",))
        refused = "cannot start a transaction within a transaction"
        with pytest.raises(StoreError, match=refused), store._write():
            pass  # pragma: no cover - refused
        tx.run("INSERT INTO bodies (raw) VALUES (?)", (b"two",))
        assert rows(store.path, "SELECT count(*) FROM bodies") == [(0,)]  # not yet committed
    assert rows(store.path, "SELECT raw FROM bodies") == [(b"one",), (b"two",)]
    store.close()


def test_a_second_store_of_the_file_in_one_process_keeps_the_first_s_writes_shared(
    store: Store, mailbox: MailboxRow
) -> None:
    """Opening the file again in the process that has it open (an MCP server's ``main`` in
    a test, a fixture's own ``Store``) closed a descriptor of it to set its mode, which drops
    every POSIX lock the process holds on the file: the next process to close its last
    connection took the first store for gone and deleted the log, and what the first store
    wrote after that went to a deleted log no other process would ever read."""
    Store(store.path).close()
    read = (
        "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute(sys.argv[2]).fetchall())"
    )
    query = "SELECT mailbox_id FROM mailboxes ORDER BY mailbox_id"

    def another_process_reads() -> str:  # opens the file, reads, closes its connection
        return subprocess.run(
            [sys.executable, "-c", read, str(store.path), query],
            check=True,
            timeout=SAFETY,
            capture_output=True,
            text=True,
        ).stdout.strip()

    assert another_process_reads() == str([(mailbox.mailbox_id,)])
    second, _ = store.reserve(run_id="r-after", purpose="hard", ttl=600, domain="mailbox.test")

    assert another_process_reads() == str(sorted([(mailbox.mailbox_id,), (second.mailbox_id,)]))


def test_opening_a_file_that_is_no_database_is_a_store_error_and_leaves_nothing_open(
    tmp_path: Path,
) -> None:
    path = tmp_path / "store.sqlite3"
    path.write_bytes(b"not a database " * 512)
    with pytest.raises(StoreError, match=r"file is not a database.*; no store was opened$"):
        Store(path)
    gc.collect()  # no connection left for the collector (Python 3.13 warns: -W error)


def _path_of(length: int, under: Path) -> Path:
    """A store's path of ``length`` bytes under ``under``, in folders no file system refuses."""
    name = "store.sqlite3"
    fill = length - len(os.fsencode(under / name))  # folders to add, each with its "/"
    parts = []
    while fill > 201:
        parts.append("d" * 100)
        fill -= 101
    parts.append("d" * (fill - 1))
    path = under.joinpath(*parts, name)
    assert len(os.fsencode(path)) == length
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_store_path_too_long_for_sqlite_names_its_length_and_the_fix(tmp_path: Path) -> None:
    """SQLite opens no path longer than 504 bytes (512, less room for "-journal"): under
    a deep TMPDIR or --basetemp, every test said "unable to open database file (is its
    disk full…?)", which pointed the wrong way."""
    base = tmp_path.resolve()
    Store(_path_of(504, base)).close()  # the longest it opens

    with pytest.raises(StoreError) as refused:
        Store(_path_of(505, base / "longer"))

    assert str(refused.value).endswith(
        "failed: unable to open database file (its path is 505 bytes long, and SQLite "
        "opens none longer than 504: give pytest a shorter --basetemp, or TMPDIR); no "
        "store was opened"
    )
    del refused
    gc.collect()  # no connection left for the collector (Python 3.13 warns: -W error)


def test_a_store_file_that_is_no_database_is_a_store_error(tmp_path: Path) -> None:
    """Reads and writes alike: every error of the contract derives from MailboxError."""
    store = Store(tmp_path / "store.sqlite3")
    box = Mailbox.reserve(store, contract=EmailContract(purpose="signup"), domain="mailbox.test")
    store.close()  # its connections go; the next call opens one on what is there now
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    store.path.write_bytes(b"not a database " * 512)

    calls: dict[str, Callable[[], object]] = {
        "reserve": lambda: store.reserve(
            run_id="r-1", purpose="signup", ttl=60, domain="mailbox.test"
        ),
        "state": lambda: box.state,
        "wait_for": lambda: box.wait_for(timeout=0),
        "checkpoint": box.checkpoint,
        "receipt": box.receipt,
        "close": lambda: box.close(success=False),
    }
    for name, call in calls.items():
        with pytest.raises(StoreError, match="file is not a database") as failed:
            call()
        assert isinstance(failed.value.__cause__, sqlite3.DatabaseError), name
    store.close()
    del failed, calls
    # Each refused call opened a connection that failed its set-up: none is left unclosed
    # (Python 3.13 warns of one when it is collected, an error under -W error).
    gc.collect()


def test_a_commit_given_up_before_it_begins_stores_nothing(tmp_path: Path) -> None:
    """A sink that stops gives up what its writer thread has not committed yet, even with
    the lock free: those clients are cut off, got no ``250``, and still own the message."""
    store, big, _ = _bigger_than_the_log(tmp_path, 64 * 1024)
    stopping = threading.Event()
    stopping.set()
    with pytest.raises(StoreBusy, match="given up: the sink stops"):
        store.deliver_all([big], give_up=stopping)
    [(stored,)] = rows(store.path, "SELECT count(*) FROM messages")
    assert stored == 0
    store.close()


@pytest.mark.parametrize("removed", [("",), ("", "-wal", "-shm")], ids=["file", "with-log"])
def test_a_store_removed_while_in_use_is_a_store_error_not_a_new_empty_store(
    tmp_path: Path, removed: tuple[str, ...]
) -> None:
    """Every connection opened the path as SQLite's default does, making a database of
    it if there was none: once the file was gone (a cleanup, a second run given the same
    --basetemp), a thread's first call, or a second handle's, made a new empty store in
    its place and read or wrote there, so a mailbox reserved before was not found."""
    store = Store(tmp_path / "store.sqlite3")
    box = Mailbox.reserve(store, contract=EmailContract(purpose="signup"), domain="mailbox.test")
    for suffix in removed:
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    failed: list[BaseException] = []

    def in_a_new_thread() -> None:  # its first call opens its own connection
        try:
            store.mailbox(box.mailbox_id)
        except BaseException as exc:  # handed to the test's thread
            failed.append(exc)

    thread = threading.Thread(target=in_a_new_thread)
    thread.start()
    thread.join(SAFETY)

    [error] = failed
    assert isinstance(error, StoreError)
    assert str(error) == (
        f"the store {store.path} failed: unable to open database file (the file is gone: "
        "something removed it while the run used it (a cleanup, another pytest run given "
        "the same --basetemp); no new, empty store was made in its place); nothing was read"
    )
    assert not store.path.exists()
    store.close()
    failed.clear()
    del error
    gc.collect()  # no connection left for the collector (Python 3.13 warns: -W error)


def test_a_store_opened_with_a_relative_path_keeps_its_file_when_the_directory_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A test that changed the working directory made a new, empty store there at the next
    connection of a handle opened with a relative path (a new thread's)."""
    (tmp_path / "first").mkdir()
    (tmp_path / "second").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    store = Store(Path("store.sqlite3"))
    box = Mailbox.reserve(store, contract=EmailContract(purpose="signup"), domain="mailbox.test")
    monkeypatch.chdir(tmp_path / "second")
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(store.mailbox(box.mailbox_id)))
    thread.start()
    thread.join(SAFETY)

    [row] = found
    assert isinstance(row, MailboxRow)
    assert row.mailbox_id == box.mailbox_id
    assert not (tmp_path / "second" / "store.sqlite3").exists()
    store.close()


def test_a_store_removed_before_its_checkpointer_starts_raises_nothing_in_its_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpointer's thread opens its connection when first asked (every
    ``CHECKPOINT_EVERY``-th commit): once connections open only a file that is there, its
    failure to open a removed store was an exception in a thread no one reads (an error
    under -W error, from pytest's threadexception plugin)."""
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    store = Store(tmp_path / "store.sqlite3")
    store.reserve(run_id="r-first", purpose="gone", ttl=600, domain="mailbox.test")
    for suffix in ("", "-wal", "-shm"):
        Path(f"{store.path}{suffix}").unlink(missing_ok=True)
    for n in range(store_module.CHECKPOINT_EVERY):  # on the connection it has: the old file
        store.reserve(run_id=f"r-{n}", purpose="gone", ttl=600, domain="mailbox.test")
    assert store._checkpointer is not None  # asked, so started

    store.close()  # joins its thread

    assert raised == []
