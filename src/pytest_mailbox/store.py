"""The shared store: one SQLite file (WAL) per pytest run, used by every worker and sink.

Every write is one ``BEGIN IMMEDIATE`` transaction, so a read-then-write (claim, ack,
reserve) is atomic across processes. Fence tokens come from one store-wide counter that
only increases. Nothing here imports pytest.
"""

from __future__ import annotations

import functools
import math
import os
import secrets
import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Concatenate, NamedTuple, ParamSpec, TypeVar

from filelock import FileLock

from pytest_mailbox._clock import monotonic, wall
from pytest_mailbox.errors import StoreError
from pytest_mailbox.settings import _int, _path, _seconds, argument
from pytest_mailbox.vocabulary import Checkpoint, CloseReason, Status, digest

__all__ = [
    "Delivery",
    "History",
    "Incoming",
    "MailboxRow",
    "MessageRow",
    "Outcome",
    "Store",
    "StoreBusy",
]

Clock = Callable[[], float]

#: ``UPDATE … RETURNING`` (SQLite 3.35): the next fence in one statement instead of two.
_RETURNING = sqlite3.sqlite_version_info >= (3, 35, 0)

#: Mailbox states in which the reservation is still open.
ACTIVE = ("reserved", "waiting", "claimed", "consumed")
#: The same, as SQL: a reservation is closed (released or expired) exactly when it has a
#: ``closed_at``. The partial index below repeats this clause, which SQLite needs to use it,
#: and it reads no column that changes while the mailbox is open: the steps of a test
#: (waiting, claimed, consumed) rewrite no index page.
_OPEN = "closed_at IS NULL"
#: The most ``refused`` steps a mailbox records: a client that repeats a refused ``RCPT``
#: (10,000 on one connection, or over many) wrote a step, a store write and a timeout's
#: line each, into the receipt and JUnit's report. The last one says that more go unrecorded.
REFUSED_STEPS = 10
#: The count of a mailbox's ``refused`` steps, as a subquery on ``mailboxes``: through their
#: own index (the sink's event loop reads it at each refused ``RCPT``), where SQLite chose
#: the timeline's key and read every step of the mailbox (4 ms at 100,000 steps, each time).
_REFUSED_COUNT = (
    "(SELECT COUNT(*) FROM events e INDEXED BY events_refused"
    " WHERE e.mailbox_id = mailboxes.mailbox_id AND e.status = 'refused')"
)
#: What the last ``refused`` step a mailbox records adds to its detail.
REFUSED_MORE = "; further refusals for this alias are not recorded"

#: A mailbox's timeline, stored in its order (1, 2, 3… per mailbox): recording a step
#: writes one page, where a rowid table and an index on ``mailbox_id`` wrote two.
_EVENTS = """CREATE TABLE IF NOT EXISTS events (
    mailbox_id TEXT NOT NULL,
    event_id INTEGER NOT NULL,
    at REAL NOT NULL,
    status TEXT NOT NULL,
    detail TEXT NOT NULL,
    PRIMARY KEY (mailbox_id, event_id)
) WITHOUT ROWID"""

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT OR IGNORE INTO counters (name, value) VALUES ('fence', 0);
CREATE TABLE IF NOT EXISTS mailboxes (
    mailbox_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    purpose TEXT NOT NULL,
    alias TEXT NOT NULL UNIQUE,
    domain TEXT NOT NULL,
    owner TEXT NOT NULL,
    created_at REAL NOT NULL,
    expires_at REAL NOT NULL,
    fence INTEGER NOT NULL,
    state TEXT NOT NULL,
    close_reason TEXT,
    closed_at REAL,
    worker TEXT NOT NULL DEFAULT '',  -- the process that reserved it (xdist's gw0, gw1, …)
    testrun TEXT NOT NULL DEFAULT ''  -- the pytest run that reserved it (the plugin's own id)
);
-- No index holds the state: the steps of a test (waiting, claimed, consumed) rewrite
-- no index page of this table. (A store from an earlier version loses its old ones.)
DROP INDEX IF EXISTS mailboxes_key;
DROP INDEX IF EXISTS mailboxes_expiry;
CREATE INDEX IF NOT EXISTS mailboxes_run ON mailboxes (run_id, purpose);
-- Every write looks for overdue open mailboxes: only the open ones are in this index.
CREATE INDEX IF NOT EXISTS mailboxes_due ON mailboxes (expires_at) WHERE {_OPEN};
CREATE TABLE IF NOT EXISTS bodies (
    body_id INTEGER PRIMARY KEY,
    raw BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS messages (
    seq INTEGER PRIMARY KEY,  -- rows are never deleted: max + 1 only ever grows
    message_id TEXT NOT NULL UNIQUE,
    mailbox_id TEXT REFERENCES mailboxes (mailbox_id),
    body_id INTEGER NOT NULL REFERENCES bodies (body_id),
    rcpt TEXT NOT NULL,
    alias TEXT NOT NULL,
    tag TEXT,
    domain TEXT NOT NULL,
    mail_from TEXT NOT NULL,
    received_at REAL NOT NULL,
    size INTEGER NOT NULL,
    subject TEXT NOT NULL,
    run_header TEXT,
    defects TEXT NOT NULL DEFAULT '',
    sink TEXT NOT NULL DEFAULT '',
    state TEXT NOT NULL DEFAULT 'waiting',
    fence INTEGER,
    holder TEXT,
    lease_until REAL,
    claimed_at REAL,
    consumed_at REAL
);
CREATE INDEX IF NOT EXISTS messages_mailbox ON messages (mailbox_id, seq);
-- Leases to reconcile: only claimed messages are in it, so a delivery writes no page of it.
-- A query that compares state with a bound parameter would make SQLite plan it again at
-- every run (the parameter might match this index's clause): compare with 'claimed'.
DROP INDEX IF EXISTS messages_claimed;
CREATE INDEX IF NOT EXISTS messages_leases ON messages (lease_until) WHERE state = 'claimed';
CREATE TABLE IF NOT EXISTS claims (
    fence INTEGER PRIMARY KEY,
    message_id TEXT NOT NULL,
    mailbox_id TEXT NOT NULL,
    holder TEXT NOT NULL,
    claimed_at REAL NOT NULL,
    lease_until REAL NOT NULL,
    state TEXT NOT NULL,
    ended_at REAL
);
CREATE INDEX IF NOT EXISTS claims_message ON claims (message_id);
{_EVENTS};
CREATE TABLE IF NOT EXISTS faults (
    fault_id INTEGER PRIMARY KEY AUTOINCREMENT,
    mailbox_id TEXT NOT NULL,
    alias TEXT NOT NULL,
    domain TEXT NOT NULL,
    stage TEXT NOT NULL,
    reply TEXT NOT NULL,
    times INTEGER NOT NULL,
    remaining INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS faults_alias ON faults (alias, domain, stage);
CREATE TABLE IF NOT EXISTS secrets (
    mailbox_id TEXT NOT NULL,
    message_id TEXT NOT NULL,
    kind TEXT NOT NULL,
    sha256 TEXT NOT NULL,
    last2 TEXT NOT NULL,
    host TEXT,
    size INTEGER,  -- its length: the pieces of a word a digest is tried on (receipts show it)
    PRIMARY KEY (message_id, kind, sha256)
);
CREATE INDEX IF NOT EXISTS secrets_mailbox ON secrets (mailbox_id);
CREATE TABLE IF NOT EXISTS keys (name TEXT PRIMARY KEY, value BLOB NOT NULL);
"""

#: What a receipt is made of, read by mailbox id: one by one (``Store.messages`` …), or
#: together in one transaction (``_history``).
_MAILBOX_SQL = "SELECT * FROM mailboxes WHERE mailbox_id = ?"
_MESSAGES_SQL = "SELECT * FROM messages WHERE mailbox_id = ? ORDER BY seq"
_EVENTS_SQL = "SELECT at, status, detail FROM events WHERE mailbox_id = ? ORDER BY event_id"
_REFUSED_SQL = (
    "SELECT at, status, detail FROM events INDEXED BY events_refused"
    " WHERE mailbox_id = ? AND status = 'refused' ORDER BY event_id"
)
_SECRETS_SQL = "SELECT * FROM secrets WHERE mailbox_id = ?"
#: A consumed step's end when the passing test's close acked the claim it still held.
_AT_CLOSE = ", acked at close as a success, not by ack()"
#: What a failed write tells: it was all one transaction, rolled back.
_NOTHING_STORED = "nothing of this call was stored"
#: What a failure while a store is opened tells.
_NOT_OPENED = "no store was opened"
#: The longest path SQLite's unix VFS opens, in bytes: 512, less room for "-journal".
_LONGEST_PATH = 504

#: Why a file of the run (the store, the agents' journal) is gone: every refusal says it so.
REMOVED = (
    "something removed it while the run used it (a cleanup, another pytest run given the "
    "same --basetemp)"
)

#: An earlier version's ``events`` (a rowid table and an index): its rows, in the new table.
_EVENTS_V1_TO_V2 = f"""
ALTER TABLE events RENAME TO events_v1;
{_EVENTS};
INSERT INTO events SELECT mailbox_id, event_id, at, status, detail FROM events_v1;
DROP TABLE events_v1
"""

#: Past this many bytes of write-ahead log, a writer checkpoints and truncates it: SQLite's
#: own (passive) checkpoints never finish while some reader is always busy, and the log
#: would grow for the whole run.
WAL_LIMIT = 16 * 1024 * 1024

#: What ``Store(path)`` allows.
STORE_PATH = "a path to a regular file, new or a store (not a directory, device or pipe)"

#: Every this many commits, a background thread copies the log into the database (a passive
#: checkpoint: it blocks neither readers nor writers). SQLite's automatic checkpoint, off
#: here, runs inside whichever commit crosses 1000 pages: a test's claim or the sink's
#: delivery would stall for the copy (see docs/performance.md, wake-up p99).
CHECKPOINT_EVERY = 50
#: Past this many pages in the log, that thread also restarts it: writers wait for the few
#: pages the passive copies left, and the log starts over from its beginning.
RESTART_PAGES = 1000
#: How long one try to restart the log may wait for readers to leave it, holding the write
#: lock (seconds): SQLite's busy handler sleeps 1 ms at its first wait.
RESTART_HOLD = 0.001

#: A write looks for overdue mailboxes other than its own at most once per this many seconds
#: of the store's clock (a handle's first write always looks). The mailbox a write acts on is
#: checked every time, and so is every mailbox a read returns: only the stored state of
#: someone else's overdue mailbox may lag, by up to this long.
SWEEP_EVERY = 1.0

#: How long a new connection's set-up may wait for a lock (it reads the schema), in seconds.
SETUP_TIMEOUT = 5.0

#: A writer that finds the lock taken retries after 50 µs, doubling up to 5 ms.
RETRY_FIRST = 0.00005
RETRY_LAST = 0.005
#: A store handle looks at the log's size after one commit in this many (each writer may
#: add this many commits' pages past ``wal_limit`` before it truncates the log).
WAL_CHECK_EVERY = 8
#: How long a writer keeps trying to truncate a log past ``wal_limit`` before going on,
#: and how many tries it makes at least, however long they take: beside readers that never
#: pause a dozen or so tries find a gap, and a loaded machine stretches the time they take
#: (0.08 s idle, 0.5 s beside eight busy processes), so a second alone could run out first.
TRUNCATE_PATIENCE = 1.0
TRUNCATE_TRIES = 64
#: After a patience spent in vain (a reader that never leaves the log: a transaction held
#: open), nobody waits to truncate the log for this long, doubling at each failure up to
#: ``TRUNCATE_BACKOFF_MAX``, then again: no wait can help until that reader lets go, so
#: the log grows meanwhile instead of every commit waiting in vain.
TRUNCATE_BACKOFF = 1.0
TRUNCATE_BACKOFF_MAX = 60.0


class MailboxRow(NamedTuple):
    """A mailbox reservation as stored (fields in the table's column order)."""

    mailbox_id: str
    run_id: str
    purpose: str
    alias: str
    domain: str
    owner: str
    created_at: float
    expires_at: float
    fence: int
    state: str
    close_reason: str | None
    closed_at: float | None
    worker: str = ""
    testrun: str = ""

    @property
    def address(self) -> str:
        return f"{self.alias}@{self.domain}"

    @property
    def active(self) -> bool:
        return self.state in ACTIVE


class MessageRow(NamedTuple):
    """One routed (or unrouted) recipient copy of an accepted message (fields in the
    table's column order: rows are built from ``SELECT *`` positionally, the cheap way)."""

    seq: int
    message_id: str
    mailbox_id: str | None
    body_id: int
    rcpt: str
    alias: str
    tag: str | None
    domain: str
    mail_from: str
    received_at: float
    size: int
    subject: str
    run_header: str | None
    defects: str
    sink: str
    state: str
    fence: int | None
    holder: str | None
    lease_until: float | None
    claimed_at: float | None
    consumed_at: float | None

    def leased(self, now: float) -> bool:
        """Under a claim whose lease has not run out at ``now``."""
        return self.state == Status.CLAIMED.value and (self.lease_until or 0) > now


class History(NamedTuple):
    """Everything a receipt is made of, read in one snapshot of the store."""

    mailbox: MailboxRow | None
    messages: list[MessageRow]
    events: list[sqlite3.Row]
    secrets: list[sqlite3.Row]


@dataclass(frozen=True)
class Delivery:
    """One envelope recipient of a message the sink accepted."""

    rcpt: str
    alias: str
    tag: str | None
    domain: str


@dataclass(frozen=True)
class Incoming:
    """One message the sink accepted, with the index it stores beside the bytes."""

    mail_from: str
    deliveries: Sequence[Delivery]
    raw: bytes
    subject: str
    run_header: str | None
    defects: Sequence[str] = ()


@dataclass(frozen=True)
class Outcome:
    """The structured result of a claim, ack, renew or release."""

    status: Status
    message_id: str = ""
    fence: int | None = None
    holder: str | None = None
    lease_until: float | None = None
    detail: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    #: A granted claim's message bytes, read in the claim's own transaction; never in
    #: ``as_dict`` (what an agent is told).
    raw: bytes | None = field(default=None, repr=False, compare=False)

    def as_dict(self) -> dict[str, Any]:
        result: dict[str, Any] = {"status": self.status.value}
        for key in ("message_id", "fence", "holder", "lease_until", "detail"):
            value = getattr(self, key)
            if value not in (None, ""):
                result[key] = value
        return {**result, **self.extra}


class Handle(NamedTuple):
    """Who acts on a claim: a mailbox, by id, and the fence of its reservation."""

    mailbox_id: str
    fence: int


class StoreBusy(Exception):
    """A write did not start: another connection holds the write lock, or the write-ahead
    log is past ``wal_limit``, and the caller asked not to wait (``wait=False``), or to
    stop waiting (``give_up``)."""


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _reads(method: Callable[Concatenate[Store, _P], _R]) -> Callable[Concatenate[Store, _P], _R]:
    """A read of the store, whose SQLite failure reaches the caller as ``StoreError``
    (writes are ``_write``'s): every error of the contract derives from ``MailboxError``."""

    @functools.wraps(method)
    def reading(self: Store, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return method(self, *args, **kwargs)
        except sqlite3.Error as exc:
            raise self._failed(exc, "nothing was read") from exc

    return reading


#: ``Store.earlier_runs_mail``: the test's other mailboxes through their owner's index, and
#: their mail through theirs. Joined as written (CROSS JOIN): with ``ORDER BY m.seq`` SQLite
#: chose to scan every message of the store, newest first, for each timeout.
_EARLIER_RUNS_MAIL = (
    "SELECT m.*, o.alias || '@' || o.domain, o.run_id "
    "FROM mailboxes b CROSS JOIN mailboxes o CROSS JOIN messages m "
    "WHERE b.mailbox_id = ? AND b.owner != '' "
    "AND o.owner = b.owner AND o.testrun = b.testrun "
    f"AND o.mailbox_id != b.mailbox_id AND NOT o.{_OPEN} AND o.closed_at <= b.created_at "
    "AND m.mailbox_id = o.mailbox_id AND m.received_at >= ? AND m.received_at >= o.closed_at "
    "ORDER BY m.seq DESC LIMIT ?"
)


class Store:
    """A handle on the shared SQLite store; safe to use from several threads."""

    def __init__(
        self,
        path: str | Path,
        *,
        clock: Clock = wall,
        busy_timeout: float = 60.0,
        wal_limit: int = WAL_LIMIT,
        worker: str = "",
        testrun: str = "",
    ):
        self.path = Path(path)
        # Refused before anything is opened or created: a directory or a device is no store
        # (SQLite's error would not name the path; /dev/null would gain a /dev/null.lock),
        # and SQLite reads a busy_timeout past 2**31 - 1 ms as 0.
        argument("path", str(self.path), str, _path, STORE_PATH)
        argument("busy_timeout", busy_timeout, (int, float), _seconds(0, 86400), "seconds 0..86400")
        argument("wal_limit", wal_limit, int, _int(1, sys.maxsize), "a positive number of bytes")
        self.worker = worker  # recorded with every mailbox this handle reserves
        #: The pytest run this handle works for, recorded with every mailbox it reserves:
        #: two runs given one --basetemp may share the file, and each closes only its own.
        self.testrun = testrun
        self.clock = clock
        self._busy_timeout = busy_timeout
        self.wal_limit = wal_limit
        self._wal = Path(f"{self.path}-wal")
        #: What every connection opens: the file made (``_open``), and only it, read from
        #: the directory this handle started in. A plain path makes an empty database of
        #: its name once the file is gone (deleted mid-run): every later connection (a new
        #: thread's, the checkpointer's) saw an empty store, and lost the run's state.
        self._where = Path(os.path.abspath(self.path))
        self._uri = existing_uri(self._where)
        self._local = threading.local()
        #: Every connection this handle opened, with the thread it is that thread's for and
        #: the process that opened it (a child a test forks inherits the list).
        self._connections: list[tuple[threading.Thread, int, sqlite3.Connection]] = []
        self._lock = threading.Lock()
        self._commits = 0
        self._next_sweep = -math.inf  # see SWEEP_EVERY
        self._wal_over = False  # the log was past wal_limit at the last look
        self._truncate_after = -math.inf  # monotonic(): see TRUNCATE_BACKOFF
        self._backoff = TRUNCATE_BACKOFF
        self._checkpointing = False  # the last try at truncating found a checkpoint running
        self._checkpointer: _Checkpointer | None = None
        self._retired: str | None = None  # see retire()
        #: What a failed write says of itself: while the schema is read or made, that no
        #: store was opened (the caller's call never began); then, that its one
        #: transaction was rolled back.
        self._outcome = _NOT_OPENED
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._open()
        except BaseException as exc:  # no handle to close its connections afterwards
            self.close()
            if isinstance(exc, sqlite3.Error):
                raise self._failed(exc, _NOT_OPENED) from exc
            raise
        self._outcome = _NOTHING_STORED

    def _open(self) -> None:
        """Create or migrate the schema, and read the digests' key."""
        with FileLock(str(self.path) + ".lock"):
            owner_only(self.path)  # it holds every body in clear, and the digests' key
            conn = self._conn()
            conn.execute("PRAGMA journal_mode=WAL")
            with self._write() as tx:
                tx.executescript_in_tx(_SCHEMA)
                columns = {row[1] for row in tx.all("PRAGMA table_info(mailboxes)")}
                for column in ("worker", "testrun"):  # a store file from an earlier version
                    if column not in columns:
                        tx.run(
                            f"ALTER TABLE mailboxes ADD COLUMN {column} TEXT NOT NULL DEFAULT ''"
                        )
                # A timeout's near misses look up the same test's other mailboxes of the run
                # (a rerun's earlier attempt) by owner, which no step of a test rewrites;
                # after the migration, which adds ``testrun`` to an earlier version's file.
                tx.run("CREATE INDEX IF NOT EXISTS mailboxes_owner ON mailboxes (owner, testrun)")
                if "size" not in {row[1] for row in tx.all("PRAGMA table_info(secrets)")}:
                    tx.run("ALTER TABLE secrets ADD COLUMN size INTEGER")
                (events,) = tx.one("SELECT sql FROM sqlite_master WHERE name = 'events'") or ("",)
                if "WITHOUT ROWID" not in events.upper():  # its ids, store-wide, keep the order
                    tx.executescript_in_tx(_EVENTS_V1_TO_V2)
                # The refused steps, for their cap (_REFUSED_COUNT): after the migration,
                # which makes the table again; only a refused step writes to it.
                tx.run(
                    "CREATE INDEX IF NOT EXISTS events_refused ON events (mailbox_id)"
                    " WHERE status = 'refused'"
                )
                # The key of the secrets' digests: random, the same for every process.
                key = secrets.token_bytes(32)
                tx.run("INSERT OR IGNORE INTO keys VALUES ('digest', ?)", (key,))
                kept = tx.one("SELECT value FROM keys WHERE name = 'digest'")
                self._digest_key: bytes = kept[0] if kept is not None else key

    # -- connections and transactions -------------------------------------------------

    def _conn(self, *, writer: bool = False) -> sqlite3.Connection:
        """This thread's connection for reads (it waits up to ``busy_timeout`` when SQLite
        says busy, which in WAL mode readers almost never meet), or for ``writer``
        transactions (it never waits by itself: ``_write`` retries, see there)."""
        key = "writer" if writer else "reader"
        conn: sqlite3.Connection | None = getattr(self._local, key, None)
        if conn is None:
            if self._retired is not None:
                raise StoreError(self._retired)
            # Each thread uses its own connections; only close() and the next thread's
            # first connection reach across threads.
            conn = _connect(self._uri, timeout=0.0 if writer else self._busy_timeout)
            conn.row_factory = sqlite3.Row
            setattr(self._local, key, conn)
            with self._lock:
                self._close_ended()
                self._connections.append((threading.current_thread(), os.getpid(), conn))
        return conn

    def _close_ended(self) -> None:
        """Close the connections of threads that have ended (the lock held): a test that
        waits from a thread of its own, ``AgentTools.acall`` in each async test's new
        executor, a sink started again. Nothing else closes them before ``close()``, and
        each kept its file descriptors and its page cache: two connections a thread. The
        main thread's stay: it counts as ended once the interpreter begins to exit, and
        may still use them then (an ``atexit`` handler).

        Only this process's: in a child a test forked, the parent's threads all count as
        ended (a thread ``threading`` did not start even raises when asked), yet their
        connections are the parent's, in use there, and SQLite's rule is that a child never
        uses one it inherited, closing included: one caught in a write transaction would
        roll it back on the shared-memory index the parent still writes."""
        pid = os.getpid()
        kept = []
        for thread, owner, conn in self._connections:
            if owner != pid or thread is threading.main_thread() or thread.is_alive():
                kept.append((thread, owner, conn))
            else:
                conn.close()
        self._connections[:] = kept

    @contextmanager
    def _write(self, *, wait: bool = True, give_up: threading.Event | None = None) -> Iterator[_Tx]:
        """One ``BEGIN IMMEDIATE`` transaction. Callers read the clock inside it: waiting for
        the write lock (up to ``busy_timeout``) must not stretch a lease or revive one.

        Waiting is a retry loop that starts at 50 µs: SQLite's own busy handler sleeps
        1 ms, then 2, then 5…, which made every collision between two xdist workers cost
        milliseconds. ``wait=False`` raises ``StoreBusy`` at once instead, and never waits
        on anything: for an event loop that must not block. It also refuses while the log
        is known to be past ``wal_limit``, which a writer that may wait truncates (the
        sink's writer thread, which takes what the loop could not commit): a background
        checkpointer cannot, beside writers that never stop. Once ``give_up`` is set, the
        next refusal raises ``StoreBusy`` too (within one pause, at most ``RETRY_LAST``):
        for a sink that stops.
        """
        if not wait and self._wal_over and monotonic() >= self._truncate_after:
            msg = "the write-ahead log is past wal_limit: a writer that may wait truncates it"
            raise StoreBusy(msg)
        if give_up is not None and give_up.is_set():  # its client is cut off: it owns it
            msg = "given up: the sink stops"
            raise StoreBusy(msg)
        try:
            conn = self._conn(writer=True)
        except sqlite3.Error as exc:  # a file that is no SQLite database, say
            raise self._failed(exc, self._outcome) from exc
        if wait and self._wal_over:
            # Before the transaction, not after its commit: its caller reads the clock in
            # it (a lease, a ttl), and time spent truncating would come off what it grants.
            self._bound_wal(conn, give_up=give_up)
        pauses = _pauses(self._busy_timeout)  # its clock starts at the first refusal
        # The BEGIN inside the try that rolls back: an interrupt (Ctrl-C, pytest-timeout's
        # signal) raised as it returns left the connection in the transaction, holding
        # every process's writes off the store until this one ended. The transaction of a
        # write this one is inside (which BEGIN refuses) is not this one's to end; one that
        # no write holds was left by an interrupt during a rollback, and is ended first.
        outer = getattr(self._local, "writing", False)
        if conn.in_transaction and not outer:
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        try:
            while True:
                try:
                    conn.execute("BEGIN IMMEDIATE")
                    break
                except sqlite3.OperationalError as exc:
                    if not wait or (give_up is not None and give_up.is_set()):
                        raise StoreBusy(str(exc)) from None
                    if "locked" not in str(exc):
                        raise self._failed(exc, self._outcome) from exc
                    if next(pauses, False) is False:
                        msg = (
                            f"the store {self.path} stayed locked by another connection for "
                            f"its whole busy_timeout of {self._busy_timeout:g}s: a process "
                            "stopped (a debugger, SIGSTOP) or hung inside a write "
                            "transaction holds it"
                        )
                        raise StoreError(msg) from exc
            self._local.writing = True
            yield _Tx(conn)
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction and not outer:
                with suppress(sqlite3.Error):  # an I/O error may have ended it already
                    conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise self._failed(exc, self._outcome) from exc
            raise
        finally:
            self._local.writing = outer
        self._committed(wait=wait)

    def _failed(self, exc: sqlite3.Error, outcome: str) -> StoreError:
        """SQLite's refusal as the error the caller's contract knows (``provider_error``)."""
        why = "is its disk full, or did another program change or remove the file?"
        if not self._where.exists():  # a connection opened before still reads what it can
            why = f"the file is gone: {REMOVED}; no new, empty store was made in its place"
        elif "unable to open" in str(exc):  # a deep TMPDIR, say: the path is read then only
            length = len(os.fsencode(os.path.realpath(self.path)))
            if length > _LONGEST_PATH:
                why = (
                    f"its path is {length} bytes long, and SQLite opens none longer than "
                    f"{_LONGEST_PATH}: give pytest a shorter --basetemp, or TMPDIR"
                )
        return StoreError(f"the store {self.path} failed: {exc} ({why}); {outcome}")

    @contextmanager
    def _read(self) -> Iterator[None]:
        """One read transaction on this thread's reader connection: every statement in it
        sees the same snapshot. However it ends, the connection is left out of it (a
        reader stuck in a transaction would see that snapshot for ever). Its callers are
        reads (``_reads``), which turn SQLite's failure into ``StoreError``."""
        conn = self._conn()
        try:
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
        finally:
            if conn.in_transaction:
                with suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")

    def _committed(self, *, wait: bool) -> None:
        """After a commit: ask the background checkpointer every ``CHECKPOINT_EVERY``-th,
        and look at the log's size after this handle's first commit and every
        ``WAL_CHECK_EVERY``-th after it, and after every commit while it is known to be
        past ``wal_limit`` (a ``stat`` costs a test 15–25 µs, since it lets the sink's
        thread take the GIL). Past it, the next write that may wait truncates it before
        its transaction (``_bound_wal``); a caller that must not block (``wait=False``)
        asks the checkpointer, and its next commit is refused (``_write``)."""
        self._commits += 1
        if self._commits % CHECKPOINT_EVERY == 0:
            self._checkpointer_for().request()
        if not self._wal_over and self._commits % WAL_CHECK_EVERY != 1:
            return
        try:
            size = self._wal.stat().st_size
        except OSError:
            return
        self._wal_over = size > self.wal_limit
        if self._wal_over and not wait:
            self._checkpointer_for().request()

    def _bound_wal(self, conn: sqlite3.Connection, *, give_up: threading.Event | None) -> None:
        """Checkpoint and truncate the log, known to be past ``wal_limit``, before a write.

        Readers in the way make the checkpoint give up at once (the writer's connection
        does not wait); it is tried again every 50 µs or so for ``TRUNCATE_PATIENCE``
        seconds and ``TRUNCATE_TRIES`` tries, so it lands in the gaps between a busy
        reader's statements, which SQLite's own busy handler (sleeping 1, 2, 5, … 100 ms)
        can keep missing for as long as they read. A patience spent in vain backs off
        (``TRUNCATE_BACKOFF``); ``give_up`` ends it.
        """
        if monotonic() < self._truncate_after:
            # A back-off after a reader outlasted the last patience: no one waits for now.
            # But the reader may have let go since: every WAL_CHECK_EVERY-th commit tries
            # once, without waiting (and the next one again if the background checkpointer
            # held the checkpoint then), so that the log does not grow for the back-off's
            # rest. The checkpointer is not asked meanwhile: it would hold that lock.
            if self._commits % WAL_CHECK_EVERY == 0 or self._checkpointing:
                self._truncated(conn)
            return
        pauses = _pauses(TRUNCATE_PATIENCE, at_least=TRUNCATE_TRIES)
        while not self._truncated(conn):
            if (give_up is not None and give_up.is_set()) or next(pauses, False) is False:
                break
        else:
            return
        if give_up is None or not give_up.is_set():  # in vain: back off
            self._truncate_after = monotonic() + self._backoff
            self._backoff = min(self._backoff * 2, TRUNCATE_BACKOFF_MAX)

    def _truncated(self, conn: sqlite3.Connection) -> bool:
        """One try at copying the log back and starting it over; on success, any back-off
        ends. Best effort: busy (a reader in the log), the next writer tries again."""
        with suppress(sqlite3.Error):  # a file that is no database: the write says so
            busy, logged, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            self._checkpointing = bool(busy) and logged == -1  # another held the checkpoint
            if not busy:
                self._wal_over = False
                self._backoff = TRUNCATE_BACKOFF
                self._truncate_after = -math.inf
                return True
        return False

    def _checkpointer_for(self) -> _Checkpointer:
        with self._lock:
            if self._checkpointer is None:
                self._checkpointer = _Checkpointer(self._uri)
            return self._checkpointer

    @property
    def closed(self) -> bool:
        """No connection of this handle is open: never used, or closed since (a later call
        opens its connections again, and they are then the caller's to close)."""
        with self._lock:
            return not self._connections

    def close(self) -> None:
        """Close every connection this handle opened (from any thread)."""
        with self._lock:
            for _, _, conn in self._connections:
                conn.close()
            self._connections.clear()
            checkpointer, self._checkpointer = self._checkpointer, None
        self._local = threading.local()
        if checkpointer is not None:
            checkpointer.stop()

    def retire(self, why: str) -> None:
        """Close every connection for good: each later call raises ``StoreError(why)``,
        where after ``close()`` it opens its connections again. For a handle that served a
        pytest session, once it has ended: a mailbox or a store kept from it and used in a
        later session of the process (``pytest.main`` again, a notebook's cell run again)
        reopened the old file, answered from it, and held its connections for good."""
        self._retired = why
        self.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @_reads
    def data_version(self) -> int:
        """Changes whenever another connection commits: cheap cross-process polling."""
        row = self._conn().execute("PRAGMA data_version").fetchone()
        return int(row[0])

    # -- mailboxes ---------------------------------------------------------------------

    def reserve(
        self,
        *,
        run_id: str,
        purpose: str,
        ttl: float,
        domain: str,
        owner: str = "",
        fresh: bool = False,
    ) -> tuple[MailboxRow, bool]:
        """The active mailbox for ``run_id + purpose``, reserving one if none; (row, created).

        ``fresh`` says the caller made ``run_id`` up just now, so no reservation can hold it
        yet and there is nothing to look for.
        """
        with self._write() as tx:
            now = self.clock()
            # A run asking again finds its own overdue reservation expired, not reopened.
            self._expire_mailboxes(tx, now, due=not fresh)
            row = None
            if not fresh:
                row = tx.one(
                    f"SELECT * FROM mailboxes WHERE run_id = ? AND purpose = ? AND {_OPEN} "
                    "ORDER BY created_at DESC",
                    (run_id, purpose),
                )
            if row is not None:
                return _mailbox(row), False
            mailbox_id = f"mbx-{secrets.token_hex(6)}"
            alias = f"{purpose}-{secrets.token_hex(5)}"
            created = MailboxRow(  # as a read would give it: REAL columns come back as floats
                mailbox_id=mailbox_id,
                run_id=run_id,
                purpose=purpose,
                alias=alias,
                domain=domain,
                owner=owner,
                created_at=float(now),
                expires_at=float(now + ttl),
                fence=tx.next_fence(),
                state=Status.RESERVED.value,
                close_reason=None,
                closed_at=None,
                worker=self.worker,
                testrun=self.testrun,
            )
            tx.run(f"INSERT INTO mailboxes VALUES ({_marks(created)})", created)
            tx.event(mailbox_id, now, Status.RESERVED, f"{created.address} fence {created.fence}")
            return created, True

    @_reads
    def mailbox(self, mailbox_id: str) -> MailboxRow | None:
        """The mailbox row, reconciled first if it has expired."""
        found = self._mailbox_row(mailbox_id)
        if self._overdue(found):
            self.reconcile()
            return self.mailbox(mailbox_id)
        return found

    def _mailbox_row(self, mailbox_id: str) -> MailboxRow | None:
        row = self._conn().execute(_MAILBOX_SQL, (mailbox_id,)).fetchone()
        return None if row is None else _mailbox(row)

    def _overdue(self, row: MailboxRow | None) -> bool:
        """Still marked open, though its time is up: no write has reconciled it yet."""
        return row is not None and row.active and row.expires_at <= self.clock()

    def mark(self, mailbox_id: str, fence: int, status: Status, detail: str = "") -> Outcome | None:
        """Record a step of an open mailbox's life (``waiting`` and the like).

        None if recorded; the refusal if the mailbox is not open under ``fence`` (a closed
        reservation is never reopened).
        """
        with self._write() as tx:
            now = self.clock()
            opened = self._open_mailbox(tx, mailbox_id, fence, now)
            if isinstance(opened, Outcome):
                return opened
            self._mark(tx, mailbox_id, status, detail, now)
        return None

    def release(
        self, mailbox_id: str, fence: int, reason: CloseReason, *, ack_for: str | None = None
    ) -> Outcome:
        """End a reservation; live claims it holds are released with it.

        ``ack_for`` first acks the claims that run holds under a live lease, in the same
        transaction (a test that passed consumed what it claimed).
        """
        with self._write() as tx:
            return self._release(tx, mailbox_id, fence, reason, ack_for)

    def release_and_read(
        self, mailbox_id: str, fence: int, reason: CloseReason, *, ack_for: str | None = None
    ) -> tuple[Outcome, History]:
        """``release``, and the ``history`` it leaves, in one transaction: a test's teardown
        writes and reads the store once (the release refused, the history is still read)."""
        with self._write() as tx:
            outcome = self._release(tx, mailbox_id, fence, reason, ack_for)
            return outcome, _history(tx.conn, mailbox_id)

    def _release(
        self, tx: _Tx, mailbox_id: str, fence: int, reason: CloseReason, ack_for: str | None
    ) -> Outcome:
        now = self.clock()
        opened = self._open_mailbox(tx, mailbox_id, fence, now)
        if isinstance(opened, Outcome):
            return opened
        if ack_for is not None:
            for held in tx.all(
                "SELECT message_id, fence FROM messages WHERE mailbox_id = ? AND state = 'claimed'"
                " AND holder = ? AND lease_until > ?",
                (mailbox_id, ack_for, now),
            ):
                self._consume(tx, held["message_id"], held["fence"], mailbox_id, now, _AT_CLOSE)
        self._released(tx, mailbox_id, reason, now)
        return Outcome(Status.RELEASED, detail=reason.value)

    def unpassed(self, mailbox_id: str, fence: int) -> bool:
        """Make a ``released_success`` close reason ``released_error``, with a step saying
        why: the mailbox was released as a success (by the test's code or an agent) before
        a test that did not pass ended. A close reason says how the test went, and a
        receipt must not call a failed test a success. Whether anything changed."""
        with self._write() as tx:
            changed = tx.run(
                "UPDATE mailboxes SET close_reason = ? WHERE mailbox_id = ? AND fence = ? "
                "AND state = 'released' AND close_reason = ?",
                (
                    CloseReason.RELEASED_ERROR.value,
                    mailbox_id,
                    fence,
                    CloseReason.RELEASED_SUCCESS.value,
                ),
            ).rowcount
            if changed:
                detail = (
                    f"{CloseReason.RELEASED_ERROR.value}: the test did not pass (it was "
                    f"released as {CloseReason.RELEASED_SUCCESS.value} before its end)"
                )
                tx.event(mailbox_id, self.clock(), Status.RELEASED, detail)
        return bool(changed)

    def _released(self, tx: _Tx, mailbox_id: str, reason: CloseReason, now: float) -> None:
        """Close an open mailbox as released for ``reason``: its claims end, and its step."""
        self._end_claims(tx, mailbox_id, "released", now)
        tx.run(
            "UPDATE mailboxes SET state = ?, close_reason = ?, closed_at = ? WHERE mailbox_id = ?",
            (Status.RELEASED.value, reason.value, now, mailbox_id),
        )
        tx.event(mailbox_id, now, Status.RELEASED, reason.value)

    # -- messages ----------------------------------------------------------------------

    def deliver(
        self,
        *,
        mail_from: str,
        deliveries: Sequence[Delivery],
        raw: bytes,
        subject: str,
        run_header: str | None,
        defects: Sequence[str] = (),
        sink: str = "",
    ) -> list[str]:
        """Commit one accepted message: one body, one row per recipient; returns message ids."""
        incoming = Incoming(mail_from, deliveries, raw, subject, run_header, defects)
        return self.deliver_all([incoming], sink=sink)[0]

    def deliver_all(
        self,
        messages: Sequence[Incoming],
        *,
        sink: str = "",
        wait: bool = True,
        give_up: threading.Event | None = None,
    ) -> list[list[str]]:
        """Commit several accepted messages in one transaction (all or none); their ids.

        With ``wait=False`` it raises ``StoreBusy`` instead of waiting for the write lock
        (or while the log is past ``wal_limit``), and it stops waiting with ``StoreBusy``
        once ``give_up`` is set: nothing is stored.
        """
        ids: list[list[str]] = []
        with self._write(wait=wait, give_up=give_up) as tx:
            now = self.clock()
            for message in messages:
                ids.append(self._deliver(tx, message, now, sink))
        return ids

    def _deliver(self, tx: _Tx, message: Incoming, now: float, sink: str) -> list[str]:
        ids: list[str] = []
        raw = message.raw
        body_id = tx.run("INSERT INTO bodies (raw) VALUES (?)", (raw,)).lastrowid
        for delivery in message.deliveries:
            row = tx.one(
                "SELECT mailbox_id FROM mailboxes WHERE alias = ? AND domain = ?",
                (delivery.alias, delivery.domain),
            )
            mailbox_id = None if row is None else str(row[0])
            message_id = f"m-{secrets.token_hex(6)}"
            tx.run(
                "INSERT INTO messages (message_id, mailbox_id, body_id, rcpt, alias, tag,"
                " domain, mail_from, received_at, size, subject, run_header, defects, sink)"
                " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    message_id,
                    mailbox_id,
                    body_id,
                    delivery.rcpt,
                    delivery.alias,
                    delivery.tag,
                    delivery.domain,
                    message.mail_from,
                    now,
                    len(raw),
                    message.subject,
                    message.run_header,
                    ",".join(message.defects),
                    sink,
                ),
            )
            if mailbox_id is not None:
                tx.event(mailbox_id, now, "received", message_id)
            ids.append(message_id)
        return ids

    @_reads
    def checkpoint(self) -> Checkpoint:
        """The current position: later messages have a higher ``seq``."""
        row = self._conn().execute("SELECT COALESCE(MAX(seq), 0) FROM messages").fetchone()
        return Checkpoint(seq=int(row[0]), at=self.clock())

    @_reads
    def messages(self, mailbox_id: str) -> list[MessageRow]:
        """Every message routed to the mailbox, oldest first."""
        # Every read takes its rows at once: a cursor left part-read (an exception while
        # iterating it, kept alive by its traceback) would hold this thread's reader on
        # that snapshot, and mailboxes reserved after it would not be found.
        return [_message(r) for r in self._conn().execute(_MESSAGES_SQL, (mailbox_id,)).fetchall()]

    @_reads
    def message(self, message_id: str) -> MessageRow | None:
        row = (
            self._conn()
            .execute("SELECT * FROM messages WHERE message_id = ?", (message_id,))
            .fetchone()
        )
        return None if row is None else _message(row)

    @_reads
    def unrouted(
        self, domain: str | None, *, since: float = 0.0, limit: int = 200
    ) -> list[MessageRow]:
        """The newest mail for unknown aliases of ``domain`` (``None``: of every domain)
        since ``since``, oldest first."""
        rows = (
            self._conn()
            .execute(
                "SELECT * FROM messages WHERE mailbox_id IS NULL AND (? IS NULL OR domain = ?) "
                "AND received_at >= ? ORDER BY seq DESC LIMIT ?",
                (domain, domain, since, limit),
            )
            .fetchall()
        )
        return [_message(r) for r in reversed(rows)]

    @_reads
    def earlier_runs_mail(
        self, mailbox_id: str, *, since: float, limit: int = 20
    ) -> list[tuple[MessageRow, str, str]]:
        """Mail received since ``since`` for the closed mailboxes of the test that reserved
        ``mailbox_id`` (its owner, a node id) in the same pytest run, once they were closed:
        its earlier attempts (a rerun, a repetition under one node id), closed before
        ``mailbox_id`` was reserved, to which an app that kept their address still sends;
        not what the same test running at once in another worker (``--dist each``) got
        while open, nor another mailbox of the same attempt that it closed as it went.
        (message, that mailbox's address, its run id), oldest first."""
        rows = self._conn().execute(_EARLIER_RUNS_MAIL, (mailbox_id, since, limit)).fetchall()
        return [(_message(r[:-2]), str(r[-2]), str(r[-1])) for r in reversed(rows)]

    @_reads
    def late(
        self, *, since: float, worker: str, testrun: str, owner: str, limit: int = 6
    ) -> list[tuple[MessageRow, MailboxRow]]:
        """The newest mail since ``since`` for mailboxes that ``worker`` reserved in
        ``testrun`` and had closed before it came (late mail of an earlier test: an app
        that kept its address), with each one's mailbox, oldest first. Not a mailbox of
        ``owner``'s (unless ``""``): an earlier attempt's, ``earlier_runs_mail`` names it.
        None without a ``testrun``: a mailbox reserved through the library API has none, nor
        a worker, and another program's, or its run before, would be named as this one's."""
        if not testrun:
            return []
        rows = (
            self._conn()
            .execute(
                # The closed mailboxes first, then their mail by its mailbox's index (CROSS
                # JOIN, as _EARLIER_RUNS_MAIL): SQLite scanned every message of the store.
                "SELECT m.*, b.* FROM mailboxes b CROSS JOIN messages m"
                " WHERE b.worker = ? AND b.testrun = ? AND b.closed_at IS NOT NULL"
                " AND (b.owner != ? OR b.owner = '')"
                " AND m.mailbox_id = b.mailbox_id AND m.received_at >= ?"
                " AND b.closed_at <= m.received_at"
                " ORDER BY m.seq DESC LIMIT ?",
                (worker, testrun, owner, since, limit),
            )
            .fetchall()
        )
        width = len(MessageRow._fields)
        return [
            (MessageRow._make(tuple(r)[:width]), MailboxRow._make(tuple(r)[width:]))
            for r in reversed(rows)
        ]

    @_reads
    def raw(self, body_id: int) -> bytes:
        """A message's bytes, read from disk on demand."""
        row = (
            self._conn().execute("SELECT raw FROM bodies WHERE body_id = ?", (body_id,)).fetchone()
        )
        return b"" if row is None else bytes(row[0])

    def add_fault(
        self, mailbox_id: str, fence: int, *, stage: str, reply: str, times: int
    ) -> Outcome | None:
        """Arm a scripted SMTP reply for this mailbox's alias; None if armed, else why not."""
        with self._write() as tx:
            now = self.clock()
            opened = self._open_mailbox(tx, mailbox_id, fence, now)
            if isinstance(opened, Outcome):
                return opened
            tx.run(
                "INSERT INTO faults (mailbox_id, alias, domain, stage, reply, times, remaining)"
                " VALUES (?,?,?,?,?,?,?)",
                (mailbox_id, opened.alias, opened.domain, stage, reply, times, times),
            )
            tx.event(mailbox_id, now, "fault_armed", f"{stage} answers {reply[:3]} x{times}")
        return None

    @_reads
    def fault_pending(self, alias: str, domain: str, stage: str) -> int | None:
        """The id of a scripted reply still owed at ``stage`` for ``alias@domain``, or None.

        One indexed read and never a write: in WAL mode it does not wait for writers, so the
        sink's event loop may call it.
        """
        row = (
            self._conn()
            .execute(
                "SELECT fault_id FROM faults WHERE alias = ? AND domain = ? AND stage = ? "
                "AND remaining > 0 ORDER BY fault_id LIMIT 1",
                (alias, domain, stage),
            )
            .fetchone()
        )
        return None if row is None else int(row[0])

    @_reads
    def faults_pending(self, alias: str, domain: str) -> frozenset[str]:
        """The stages (``RCPT``, ``DATA``) at which a scripted reply is still owed for
        ``alias@domain``: what a sink asks once per recipient, as it accepts it."""
        rows = (
            self._conn()
            .execute(
                "SELECT DISTINCT stage FROM faults WHERE alias = ? AND domain = ?"
                " AND remaining > 0",
                (alias, domain),
            )
            .fetchall()
        )
        return frozenset(str(row[0]) for row in rows)

    def take_fault(
        self, alias: str, domain: str, stage: str, *, give_up: threading.Event | None = None
    ) -> str | None:
        """The scripted reply owed at ``stage`` for ``alias@domain``, counted once; else None.
        ``StoreBusy`` if ``give_up`` is set while it waits for the write lock."""
        fault_id = self.fault_pending(alias, domain, stage)
        if fault_id is None:  # the common case: one indexed read, no write
            return None
        with self._write(give_up=give_up) as tx:
            now = self.clock()
            taken = tx.run(
                "UPDATE faults SET remaining = remaining - 1 WHERE fault_id = ? AND remaining > 0",
                (fault_id,),
            ).rowcount
            if taken != 1:  # another sink took the last one first
                return None
            fault = tx.one("SELECT * FROM faults WHERE fault_id = ?", (fault_id,))
            assert fault is not None
            used = fault["times"] - fault["remaining"]
            tx.event(
                fault["mailbox_id"],
                now,
                "fault",
                f"{stage} answered {fault['reply'][:3]} ({used} of {fault['times']})",
            )
            return str(fault["reply"])

    @_reads
    def open_aliases(self, aliases: Sequence[str]) -> dict[str, str]:
        """``{alias: mailbox_id}`` of the open mailboxes among ``aliases`` (at any domain:
        an alias is unique in the store) that have room for a ``refused`` step (fewer than
        ``REFUSED_STEPS``): a flood of refusals costs a read, never a write. One indexed read:
        in WAL mode it does not wait for writers, so the sink's event loop may call it."""
        unique = sorted(set(aliases))
        if not unique:
            return {}
        rows = (
            self._conn()
            .execute(
                f"SELECT alias, mailbox_id FROM mailboxes WHERE alias IN ({_marks(unique)})"
                f" AND {_OPEN} AND {_REFUSED_COUNT} < {REFUSED_STEPS}",
                unique,
            )
            .fetchall()
        )
        return {str(row[0]): str(row[1]) for row in rows}

    def note_refused(
        self, steps: Sequence[tuple[str, str]], *, give_up: threading.Event | None = None
    ) -> None:
        """Record a ``refused`` step, ``(mailbox_id, detail)``, in each mailbox, as the sink
        answers mail for it with a refusal: nothing was stored, and the mailbox's timeline
        and a wait's timeout say why. Not in a mailbox closed meanwhile, nor past
        ``REFUSED_STEPS`` of them: the last says that further ones go unrecorded."""
        with self._write(give_up=give_up) as tx:
            now = self.clock()
            for mailbox_id, detail in steps:
                row = tx.conn.execute(
                    f"SELECT {_REFUSED_COUNT} FROM mailboxes WHERE mailbox_id = ? AND {_OPEN}",
                    (mailbox_id,),
                ).fetchone()
                if row is None or row[0] >= REFUSED_STEPS:
                    continue
                more = REFUSED_MORE if row[0] == REFUSED_STEPS - 1 else ""
                tx.event(mailbox_id, now, "refused", detail + more)

    def digest(self, value: str) -> tuple[str, str]:
        """The digest and last two characters a receipt shows for ``value``: HMAC-SHA256
        under this store's random key, so a test can check a value it knows, and a reader
        of the receipt, without the store, cannot try candidates."""
        return digest(value, self._digest_key)

    def record_secret(
        self,
        mailbox_id: str,
        message_id: str,
        kind: str,
        sha256: str,
        last2: str,
        host: str | None,
        size: int | None = None,
    ) -> None:
        """Remember that a secret was extracted: its digest and length, never its value."""
        with self._write() as tx:
            tx.run(
                "INSERT OR IGNORE INTO secrets VALUES (?,?,?,?,?,?,?)",
                (mailbox_id, message_id, kind, sha256, last2, host, size),
            )

    @_reads
    def secrets(self, mailbox_id: str) -> list[sqlite3.Row]:
        return self._conn().execute(_SECRETS_SQL, (mailbox_id,)).fetchall()

    @_reads
    def events(self, mailbox_id: str) -> list[sqlite3.Row]:
        return self._conn().execute(_EVENTS_SQL, (mailbox_id,)).fetchall()

    @_reads
    def refused(self, mailbox_id: str) -> list[sqlite3.Row]:
        """The mailbox's ``refused`` steps (at most ``REFUSED_STEPS``), oldest first, read
        through their own index: not the whole timeline, which a wait's timeout and each of
        an agent's waiting answers read for them."""
        return self._conn().execute(_REFUSED_SQL, (mailbox_id,)).fetchall()

    @_reads
    def history(self, mailbox_id: str) -> History:
        """The mailbox, its messages, its timeline and its secrets' digests, as of one moment
        (a mail that lands meanwhile is in all of them or in none); reconciled first if the
        mailbox has expired, as ``mailbox`` is."""
        with self._read():
            found = _history(self._conn(), mailbox_id)
        if self._overdue(found.mailbox):
            self.reconcile()
            return self.history(mailbox_id)
        return found

    # -- claims ------------------------------------------------------------------------

    def claim(
        self,
        *,
        mailbox_id: str,
        mailbox_fence: int,
        message_id: str,
        holder: str,
        lease: float,
        waiting: str | None = None,
    ) -> Outcome:
        """``waiting → claimed`` for one message, atomically, under a new fence token.

        ``waiting`` records the mailbox's ``waiting`` step (with that detail) first, in the
        same transaction: a wait that finds its message at once writes once, not twice.
        """
        with self._write() as tx:
            now = self.clock()
            opened = self._open_mailbox(tx, mailbox_id, mailbox_fence, now)
            if isinstance(opened, Outcome):
                return opened
            if waiting is not None:
                tx.event(mailbox_id, now, Status.WAITING, waiting)
            outcome = self._claim(tx, opened, message_id, holder, lease, now)
            if waiting is not None and outcome.status is not Status.CLAIMED:
                self._advance(tx, mailbox_id, Status.WAITING)  # the wait goes on
            return outcome

    def _claim(
        self, tx: _Tx, opened: MailboxRow, message_id: str, holder: str, lease: float, now: float
    ) -> Outcome:
        """The claim itself, inside ``claim``'s transaction, once the mailbox is open."""
        mailbox_id = opened.mailbox_id
        row = tx.one("SELECT * FROM messages WHERE message_id = ?", (message_id,))
        if row is None or row["mailbox_id"] != mailbox_id:
            return Outcome(Status.POLICY_DENIED, message_id, detail="not in this mailbox")
        msg = _message(row)
        if msg.state == Status.CONSUMED.value:
            return Outcome(
                Status.ALREADY_CONSUMED,
                message_id,
                fence=msg.fence if msg.holder == holder else None,
                holder=msg.holder,
            )
        if msg.state == Status.CLAIMED.value:
            assert msg.lease_until is not None
            if msg.lease_until > now:
                # The fence is the holder's proof; only the holder itself gets it back.
                return Outcome(
                    Status.ALREADY_CLAIMED,
                    message_id,
                    fence=msg.fence if msg.holder == holder else None,
                    holder=msg.holder,
                    lease_until=msg.lease_until,
                )
            self._lapse(tx, message_id, msg.fence, mailbox_id, now)
        lease_until = min(now + lease, opened.expires_at)
        fence = tx.next_fence()
        updated = tx.run(
            "UPDATE messages SET state = 'claimed', fence = ?, holder = ?, lease_until = ?,"
            " claimed_at = ? WHERE message_id = ? AND state = 'waiting'",
            (fence, holder, lease_until, now, message_id),
        ).rowcount
        if updated != 1:  # pragma: no cover - the transaction makes this unreachable
            return Outcome(Status.PROVIDER_ERROR, message_id, detail="lost update")
        tx.run(
            "INSERT INTO claims VALUES (?,?,?,?,?,?,?,NULL)",
            (fence, message_id, mailbox_id, holder, now, lease_until, "claimed"),
        )
        self._advance(tx, mailbox_id, Status.CLAIMED)  # a second claim: still 'consumed'
        tx.event(mailbox_id, now, Status.CLAIMED, f"{message_id} fence {fence}")
        body = tx.one("SELECT raw FROM bodies WHERE body_id = ?", (msg.body_id,))
        return Outcome(
            Status.CLAIMED,
            message_id,
            fence=fence,
            holder=holder,
            lease_until=lease_until,
            raw=b"" if body is None else bytes(body[0]),
        )

    def ack(self, message_id: str, fence: int, *, mailbox: Handle | None = None) -> Outcome:
        """``claimed → consumed`` only for the current fence under a live lease."""
        with self._write() as tx:
            now = self.clock()
            checked = self._current_claim(tx, message_id, fence, now, mailbox)
            if checked.status is not Status.CLAIMED:
                return checked
            self._consume(tx, message_id, fence, checked.extra["mailbox_id"], now)
            return Outcome(Status.CONSUMED, message_id, fence=fence, holder=checked.holder)

    def renew(
        self, message_id: str, fence: int, lease: float, *, mailbox: Handle | None = None
    ) -> Outcome:
        """Extend a live lease under the same fence: to ``lease`` seconds from now (within
        the mailbox's ttl), or not at all if it already ends later: a renewal never
        shortens a lease (``renew(0.05)`` on a lease of 60 s would have ended it)."""
        with self._write() as tx:
            now = self.clock()
            checked = self._current_claim(tx, message_id, fence, now, mailbox)
            if checked.status is not Status.CLAIMED:
                return checked
            expiry = tx.one(
                "SELECT expires_at FROM mailboxes WHERE mailbox_id = ?",
                (checked.extra["mailbox_id"],),
            )
            assert expiry is not None
            assert checked.lease_until is not None
            lease_until = max(checked.lease_until, min(now + lease, float(expiry[0])))
            tx.run(
                "UPDATE messages SET lease_until = ? WHERE message_id = ?",
                (lease_until, message_id),
            )
            tx.run("UPDATE claims SET lease_until = ? WHERE fence = ?", (lease_until, fence))
            tx.event(checked.extra["mailbox_id"], now, "renewed", f"{message_id} fence {fence}")
            return Outcome(
                Status.CLAIMED,
                message_id,
                fence=fence,
                holder=checked.holder,
                lease_until=lease_until,
            )

    def release_claim(
        self, message_id: str, fence: int, *, mailbox: Handle | None = None
    ) -> Outcome:
        """Give a claimed message back (``claimed → waiting``) without consuming it."""
        with self._write() as tx:
            now = self.clock()
            checked = self._current_claim(tx, message_id, fence, now, mailbox)
            if checked.status is not Status.CLAIMED:
                return checked
            self._end_claim(tx, message_id, fence, "released", now)
            tx.event(checked.extra["mailbox_id"], now, "unclaimed", f"{message_id} fence {fence}")
            return Outcome(Status.WAITING, message_id, fence=fence)

    # -- reconciliation ----------------------------------------------------------------

    def reconcile(self) -> dict[str, int]:
        """Expire overdue mailboxes and leases; idempotent, safe from several processes."""
        with self._write() as tx:
            now = self.clock()
            mailboxes = self._expire_mailboxes(tx, now)
            leases = 0
            for row in tx.all(
                "SELECT message_id, fence, mailbox_id FROM messages "
                "WHERE state = 'claimed' AND lease_until <= ?",
                (now,),
            ):
                self._lapse(tx, row["message_id"], row["fence"], row["mailbox_id"], now)
                leases += 1
        return {"mailboxes": mailboxes, "leases": leases}

    def close_orphans(
        self,
        *,
        owner: str | None = None,
        worker: str = "",
        testrun: str | None = None,
        detail: str = "the run ended with the mailbox open",
    ) -> list[str]:
        """Release every mailbox still open (of the pytest run ``testrun`` only, if given),
        or only those ``owner`` reserved in ``worker``, as ``released_error`` after an
        ``orphaned`` step (its test never released it: an error, not a ttl that ran out,
        and its ``expires_at`` stays the one it was given); the ids of those it closed.

        Only the process that outlives every test (the xdist controller, or the single
        process) calls this: at the very end of a run, when no test can still hold a
        mailbox, or for one test whose worker died while it ran (the same test may be
        running in another worker, under ``--dist each``).
        """
        where: str = _OPEN
        params: tuple[str, ...] = ()
        if owner is not None:
            where, params = f"{where} AND owner = ? AND worker = ?", (owner, worker)
        if testrun is not None:  # and those reserved outside any run's handle
            where, params = f"{where} AND testrun IN (?, '')", (*params, testrun)
        with self._write() as tx:
            now = self.clock()
            # Those whose ttl did run out end as they are (``expired``), and nothing follows
            # a mailbox's closing step: only the rest are orphans.
            self._expire_mailboxes(tx, now)
            orphans = [
                str(row[0])
                for row in tx.all(f"SELECT mailbox_id FROM mailboxes WHERE {where}", params)
            ]
            for mailbox_id in orphans:
                tx.event(mailbox_id, now, "orphaned", detail)
                self._released(tx, mailbox_id, CloseReason.RELEASED_ERROR, now)
        return orphans

    @_reads
    def mailbox_ids(self, *, owner: str, worker: str, testrun: str) -> list[str]:
        """The mailboxes ``owner`` (a test's node id) reserved in ``worker`` of the pytest
        run ``testrun``, oldest first: two runs given one --basetemp share the file, and
        their tests and workers have the same names."""
        rows = self._conn().execute(
            "SELECT mailbox_id FROM mailboxes WHERE owner = ? AND worker = ? AND testrun = ?"
            " ORDER BY created_at",
            (owner, worker, testrun),
        )
        return [str(row[0]) for row in rows.fetchall()]

    @_reads
    def stats(self, testrun: str | None = None) -> dict[str, int]:
        """Counts for the terminal summary: of the pytest run ``testrun`` only, if given
        (unrouted mail belongs to no run, and is counted whole)."""
        conn = self._conn()
        ours, params = ("", ()) if testrun is None else ("testrun IN (?, '')", (testrun,))
        of_run = f"mailbox_id IN (SELECT mailbox_id FROM mailboxes WHERE {ours})" if ours else ""

        def count(table: str, *where: str) -> int:
            clause = " AND ".join(w for w in where if w)
            sql = f"SELECT COUNT(*) FROM {table}" + (f" WHERE {clause}" if clause else "")
            return int(conn.execute(sql, params[: clause.count("?")]).fetchone()[0])

        return {
            "reserved": count("mailboxes", ours),
            "received": count("messages", "mailbox_id IS NOT NULL", of_run),
            "claimed": count("claims", of_run),
            "consumed": count("messages", "state = 'consumed'", of_run),
            "expired": count("mailboxes", "state = 'expired'", ours),
            "claims expired": count("claims", "state = 'expired'", of_run),
            "unrouted": count("messages", "mailbox_id IS NULL"),
        }

    @_reads
    def other_runs(self, testrun: str) -> bool:
        """Whether another pytest run reserved mailboxes in this store (two runs given one
        ``--basetemp`` at once)."""
        found = self._conn().execute(
            "SELECT 1 FROM mailboxes WHERE testrun NOT IN (?, '') LIMIT 1", (testrun,)
        )
        return found.fetchone() is not None

    # -- helpers (run inside a write transaction) --------------------------------------

    def _expire_mailboxes(self, tx: _Tx, now: float, *, due: bool = True) -> int:
        """Expire every overdue open mailbox; with ``due=False`` only if ``SWEEP_EVERY`` has
        passed since this handle last looked."""
        if not due and now < self._next_sweep:
            return 0
        self._next_sweep = now + SWEEP_EVERY
        overdue = tx.all(
            f"SELECT mailbox_id FROM mailboxes WHERE {_OPEN} AND expires_at <= ?", (now,)
        )
        for row in overdue:
            mailbox_id = row["mailbox_id"]
            self._end_claims(tx, mailbox_id, "expired", now)
            tx.run(
                "UPDATE mailboxes SET state = 'expired', close_reason = ?, closed_at = ? "
                "WHERE mailbox_id = ?",
                (CloseReason.EXPIRED_TIMEOUT.value, now, mailbox_id),
            )
            tx.event(mailbox_id, now, Status.EXPIRED, CloseReason.EXPIRED_TIMEOUT.value)
        return len(overdue)

    @classmethod
    def _mark(cls, tx: _Tx, mailbox_id: str, status: Status, detail: str, now: float) -> None:
        if status in (Status.WAITING, Status.CLAIMED, Status.CONSUMED):
            cls._advance(tx, mailbox_id, status)
        tx.event(mailbox_id, now, status, detail)

    @staticmethod
    def _advance(tx: _Tx, mailbox_id: str, status: Status) -> None:
        """States only move forward: a late "waiting" never hides a claim or an ack."""
        earlier = ACTIVE[: ACTIVE.index(status.value)]
        tx.run(
            f"UPDATE mailboxes SET state = ? WHERE mailbox_id = ? AND state IN ({_marks(earlier)})",
            (status.value, mailbox_id, *earlier),
        )

    def _reconciled(self, tx: _Tx, mailbox_id: str, now: float) -> sqlite3.Row | None:
        """The row of the mailbox a write acts on, after the sweep if one is due
        (``SWEEP_EVERY``), and at once if this mailbox is overdue: then it reads expired."""
        self._expire_mailboxes(tx, now, due=False)
        row = tx.one(_MAILBOX_SQL, (mailbox_id,))
        if row is not None and row["closed_at"] is None and row["expires_at"] <= now:
            self._expire_mailboxes(tx, now)
            row = tx.one(_MAILBOX_SQL, (mailbox_id,))
        return row

    def _open_mailbox(
        self, tx: _Tx, mailbox_id: str, fence: int, now: float
    ) -> MailboxRow | Outcome:
        """The mailbox, if it is open under ``fence``; else why not (expiring it if due)."""
        row = self._reconciled(tx, mailbox_id, now)
        if row is None:
            return Outcome(Status.POLICY_DENIED, detail=f"unknown mailbox {mailbox_id}")
        found = _mailbox(row)
        if found.fence != fence:
            return Outcome(Status.FENCE_MISMATCH, fence=fence, detail="stale mailbox handle")
        if not found.active:
            return Outcome(Status(found.state), detail=found.close_reason or "")
        return found

    def _current_claim(
        self, tx: _Tx, message_id: str, fence: int, now: float, handle: Handle | None
    ) -> Outcome:
        """``claimed`` (with the mailbox id) if ``fence`` holds a live lease, else why not.

        With ``handle`` (the caller's mailbox and its fence), only a message of that mailbox,
        while that reservation is open, may be acted on."""
        row = tx.one("SELECT * FROM messages WHERE message_id = ?", (message_id,))
        if row is None or row["mailbox_id"] is None:
            return Outcome(Status.POLICY_DENIED, message_id, detail="unknown message id")
        if handle is not None and row["mailbox_id"] != handle.mailbox_id:
            return Outcome(Status.POLICY_DENIED, message_id, detail="not in this mailbox")
        msg = _message(row)
        # A closed reservation refuses everything with its own state, before any claim check
        # (release() ends its claims as 'released', which must not read as a stale fence).
        mailbox = self._reconciled(tx, row["mailbox_id"], now)
        if mailbox is not None and mailbox["state"] not in ACTIVE:
            return Outcome(
                Status(mailbox["state"]),
                message_id,
                fence=fence,
                detail=mailbox["close_reason"] or "",
            )
        if handle is not None and mailbox is not None and mailbox["fence"] != handle.fence:
            return Outcome(
                Status.FENCE_MISMATCH, message_id, fence=fence, detail="stale mailbox handle"
            )
        claim = tx.one(
            "SELECT * FROM claims WHERE fence = ? AND message_id = ?", (fence, message_id)
        )
        if msg.state == Status.CONSUMED.value and msg.fence == fence:
            # Its own holder, retrying: done already, do not click twice.
            return Outcome(Status.ALREADY_CONSUMED, message_id, fence=fence, holder=msg.holder)
        if msg.state == Status.CONSUMED.value:
            # Someone else's fence, or a forged one: the consuming fence is not theirs to see.
            return Outcome(
                Status.FENCE_MISMATCH,
                message_id,
                fence=fence,
                detail=f"fence {fence} is not the claim that consumed the message",
            )
        if claim is not None and claim["state"] == "released":
            return Outcome(
                Status.FENCE_MISMATCH,
                message_id,
                fence=fence,
                detail=f"the claim with fence {fence} was released",
            )
        if claim is None or msg.fence != fence:
            # Answer with the fence presented: the current one is its holder's proof alone.
            return Outcome(
                Status.FENCE_MISMATCH,
                message_id,
                fence=fence,
                detail=f"fence {fence} is not the current claim",
            )
        if (
            msg.state != Status.CLAIMED.value
            or claim["state"] == "expired"
            or (msg.lease_until is not None and msg.lease_until <= now)
        ):
            if msg.state == Status.CLAIMED.value:
                self._lapse(tx, message_id, fence, row["mailbox_id"], now)
            return Outcome(
                Status.LEASE_EXPIRED, message_id, fence=fence, lease_until=msg.lease_until
            )
        return Outcome(
            Status.CLAIMED,
            message_id,
            fence=fence,
            holder=msg.holder,
            lease_until=msg.lease_until,
            extra={"mailbox_id": msg.mailbox_id},
        )

    @staticmethod
    def _consume(
        tx: _Tx, message_id: str, fence: int, mailbox_id: str, now: float, how: str = ""
    ) -> None:
        """``claimed → consumed`` for a claim already checked to be live under ``fence``;
        ``how`` ends the step's detail (``_AT_CLOSE``: no ``ack()`` of the test's own)."""
        tx.run(
            "UPDATE messages SET state = 'consumed', consumed_at = ? WHERE message_id = ?",
            (now, message_id),
        )
        tx.run("UPDATE claims SET state = 'consumed', ended_at = ? WHERE fence = ?", (now, fence))
        tx.run(
            "UPDATE mailboxes SET state = 'consumed' WHERE mailbox_id = ? AND state IN "
            f"({_marks(ACTIVE)})",
            (mailbox_id, *ACTIVE),
        )
        tx.event(mailbox_id, now, Status.CONSUMED, f"{message_id} fence {fence}{how}")

    def _end_claims(self, tx: _Tx, mailbox_id: str, state: str, now: float) -> None:
        """End every claim on the mailbox's messages (release or expiry); one whose lease
        ran out before is ended as lapsed, with its ``lease_expired`` step."""
        for claim in tx.all(
            "SELECT message_id, fence, lease_until FROM messages "
            "WHERE mailbox_id = ? AND state = 'claimed'",
            (mailbox_id,),
        ):
            if claim["lease_until"] is not None and claim["lease_until"] <= now:
                self._lapse(tx, claim["message_id"], claim["fence"], mailbox_id, now)
            else:
                self._end_claim(tx, claim["message_id"], claim["fence"], state, now)

    @classmethod
    def _lapse(
        cls, tx: _Tx, message_id: str, fence: int | None, mailbox_id: str, now: float
    ) -> None:
        """End a claim whose lease ran out, and say so in the mailbox's timeline: whoever
        notices first (the reconciler, a new claim, the holder's late ack) writes it."""
        cls._end_claim(tx, message_id, fence, "expired", now)
        tx.event(mailbox_id, now, Status.LEASE_EXPIRED, f"{message_id} fence {fence}")

    @staticmethod
    def _end_claim(tx: _Tx, message_id: str, fence: int | None, state: str, now: float) -> None:
        tx.run(
            "UPDATE messages SET state = 'waiting', lease_until = NULL WHERE message_id = ? "
            "AND fence IS ? AND state = 'claimed'",
            (message_id, fence),
        )
        tx.run(
            "UPDATE claims SET state = ?, ended_at = ? WHERE fence = ? AND state = 'claimed'",
            (state, now, fence),
        )


class _Checkpointer:
    """A daemon thread with its own connection: checkpoints off every request's path."""

    def __init__(self, uri: str) -> None:
        self._uri = uri
        self._wanted = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="pytest-mailbox-checkpoint", daemon=True
        )
        self._thread.start()

    def request(self) -> None:
        self._wanted.set()

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        self._wanted.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        try:
            conn = _connect(self._uri, timeout=RESTART_HOLD)
        except sqlite3.Error:  # the file is gone: the writers' connections keep what they
            return  # have, and the next new one says so (no error in a thread no one reads)
        try:
            while self._wanted.wait() and not self._stopping.is_set():
                self._wanted.clear()
                with suppress(sqlite3.Error):  # best effort: busy now, done next time
                    _, logged, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
                    if logged > RESTART_PAGES:
                        # A passive copy beside writers never leaves the log fully copied,
                        # so no writer starts it over by itself. RESTART copies the rest
                        # holding the write lock, then waits, still holding it, for the
                        # readers in the log to leave (new ones read the database alone):
                        # every writer waits with them, so only RESTART_HOLD; busy, the
                        # next request tries again. (A log past wal_limit is truncated by
                        # a writer that may wait: see Store._write.)
                        conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchall()
        finally:
            conn.close()


def owner_only(path: Path) -> None:
    """Create ``path`` readable and writable by its owner alone (``0600``, whatever the
    umask), for SQLite to open: it makes the file's log and shared-memory files with the
    file's mode. A file that exists keeps the mode it has (its user chose it); a link to
    none makes its target so.

    Only a file that is not there is opened: closing a descriptor of a file drops every
    POSIX lock the process holds on it, those of its SQLite connections too (a second
    ``Store`` of a file the process has open, an MCP server's in a test, broke the first's
    with ``disk I/O error``)."""
    try:
        target = path.resolve()  # a link to none: SQLite would make its target
    except (OSError, RuntimeError):  # a link loop (RuntimeError before Python 3.13)
        target = path  # left to SQLite, whose error names the store
    with suppress(FileExistsError):
        os.close(os.open(target, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0o600))


def existing_uri(path: Path) -> str:
    """``path`` as a SQLite URI that opens the file only if it is there (``mode=rw``, never
    ``rwc``): a store or journal removed while the run uses it is an error that names it,
    not a new empty database in its place. Absolute: a test that changes the working
    directory leaves it where it was."""
    return f"{Path(os.path.abspath(path)).as_uri()}?mode=rw"


def _connect(uri: str, *, timeout: float) -> sqlite3.Connection:
    """A connection to the store that waits up to ``timeout`` for a lock, and never syncs.

    ``synchronous=OFF``: a commit or checkpoint is in the operating system's hands when it
    returns, which is all another process needs to see it, and all a process that crashes
    needs to lose nothing. Only an operating-system crash or a power cut could lose or tear
    the file, and the store lives for one pytest run. ``NORMAL`` synced the file twice at
    every checkpoint, about 0.1 ms of every test (docs/performance.md).

    Setting it reads the schema, which waits while another connection resets the log: the
    set-up waits up to ``SETUP_TIMEOUT`` (once per connection), whatever ``timeout`` is.
    """
    conn = sqlite3.connect(
        uri, timeout=SETUP_TIMEOUT, isolation_level=None, check_same_thread=False, uri=True
    )
    try:
        conn.execute("PRAGMA synchronous=OFF")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # the _Checkpointer does it
        conn.execute(f"PRAGMA busy_timeout={int(timeout * 1000)}")
    except BaseException:  # a file that is no database: no one else would close it
        conn.close()
        raise
    return conn


class _Tx:
    """The cursor helpers used inside one write transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def run(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Cursor:
        return self.conn.execute(sql, params)

    def one(self, sql: str, params: Sequence[Any] = ()) -> sqlite3.Row | None:
        row: sqlite3.Row | None = self.conn.execute(sql, params).fetchone()
        return row

    def all(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        return self.conn.execute(sql, params).fetchall()

    def executescript_in_tx(self, script: str) -> None:
        for statement in script.split(";"):
            if statement.strip():
                self.conn.execute(statement)

    def next_fence(self) -> int:
        if _RETURNING:
            row = self.conn.execute(
                "UPDATE counters SET value = value + 1 WHERE name = 'fence' RETURNING value"
            ).fetchone()
        else:  # SQLite before 3.35 (2021)
            self.conn.execute("UPDATE counters SET value = value + 1 WHERE name = 'fence'")
            row = self.conn.execute("SELECT value FROM counters WHERE name = 'fence'").fetchone()
        return int(row[0])

    def event(self, mailbox_id: str, at: float, status: Status | str, detail: str) -> None:
        name = status.value if isinstance(status, Status) else status
        self.conn.execute(
            "INSERT INTO events VALUES (?, (SELECT COALESCE(MAX(event_id), 0) + 1 FROM events"
            " WHERE mailbox_id = ?), ?, ?, ?)",
            (mailbox_id, mailbox_id, at, name, detail),
        )


def _history(conn: sqlite3.Connection, mailbox_id: str) -> History:
    """What ``Store.history`` reads, on ``conn``: the caller holds it in one transaction."""

    def rows(sql: str) -> list[sqlite3.Row]:
        return conn.execute(sql, (mailbox_id,)).fetchall()

    found = rows(_MAILBOX_SQL)
    return History(
        _mailbox(found[0]) if found else None,
        [_message(r) for r in rows(_MESSAGES_SQL)],
        rows(_EVENTS_SQL),
        rows(_SECRETS_SQL),
    )


def _pauses(patience: float, at_least: int = 0) -> Iterator[None]:
    """Between two tries: sleep 50 µs, then twice as long each time up to 5 ms, for
    ``patience`` seconds in all (counted from the first ``next``) and ``at_least`` pauses;
    then stop."""
    deadline, delay, made = monotonic() + patience, RETRY_FIRST, 0
    while made < at_least or monotonic() < deadline:
        time.sleep(delay)
        delay = min(delay * 2, RETRY_LAST)
        made += 1
        yield


def _marks(values: Sequence[object]) -> str:
    return ",".join("?" * len(values))


def _mailbox(row: sqlite3.Row) -> MailboxRow:
    return MailboxRow._make(row)


def _message(row: sqlite3.Row) -> MessageRow:
    return MessageRow._make(row)
