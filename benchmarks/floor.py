"""The contract's floor, for the per-test benchmark: the durable writes a mailbox per test
cannot do without, and nothing else.

Per test: a reservation, the sink's delivery before its ``250``, a claim, an ack and a
release, each one ``BEGIN IMMEDIATE`` transaction of one statement on one shared SQLite
file in WAL mode, as pytest-mailbox's store does them (``synchronous=OFF``, a connection
per thread); and the contract, a pydantic model (DESIGN §2). No timeline, no store-wide
fence counter (the fence is a counter of this process), no claims table, no receipt, no
masking, no near-miss report, no selector. Its sink is a stock aiosmtpd ``SMTP``, which
inspects the protocol and handler at every connection (pytest-mailbox's sink does that
once per class): a lower bound for a suite on that sink, not for every design
(docs/performance.md, "Correction").
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pydantic
from aiosmtpd.smtp import SMTP, Envelope, Session

from benchmarks.smtp import ListHandler, ListSink

SCHEMA = """
CREATE TABLE boxes (id INTEGER PRIMARY KEY, alias TEXT NOT NULL UNIQUE, state TEXT NOT NULL);
CREATE TABLE mails (
    id INTEGER PRIMARY KEY, box TEXT NOT NULL, state TEXT NOT NULL, fence INTEGER
);
CREATE INDEX mails_box ON mails (box, state);
"""


class Contract(pydantic.BaseModel):
    """The per-test rules, with the checks of pytest-mailbox's own on these fields."""

    model_config = pydantic.ConfigDict(extra="forbid", frozen=True)

    purpose: str = pydantic.Field(default="mail", pattern=r"^[a-z][a-z0-9-]{0,29}$")
    ttl: int = pydantic.Field(default=300, gt=0)
    lease: float = pydantic.Field(default=60.0, gt=0, allow_inf_nan=False)


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=60)
    conn.execute("PRAGMA synchronous=OFF")
    return conn


def write(conn: sqlite3.Connection, sql: str, params: tuple[Any, ...] = ()) -> list[Any]:
    """One durable write: a ``BEGIN IMMEDIATE`` transaction of one statement."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        return conn.execute(sql, params).fetchall()
    finally:
        conn.execute("COMMIT")


def deliver(conn: sqlite3.Connection, alias: str) -> None:
    """The sink's durable write: the mail, waiting in ``alias``'s box."""
    write(conn, "INSERT INTO mails (box, state) VALUES (?, 'waiting')", (alias,))


class StoreHandler(ListHandler):
    """The bare list sink, committing each message to the store before its ``250``."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.conn = connect(path)

    async def handle_DATA(  # noqa: N802 - aiosmtpd hook name
        self, server: SMTP, session: Session, envelope: Envelope
    ) -> str:
        deliver(self.conn, envelope.rcpt_tos[0])
        return await super().handle_DATA(server, session, envelope)


class Writes(NamedTuple):
    """The store: the connection the tests write on, and the fences they take."""

    conn: sqlite3.Connection
    numbers: Iterator[int]


class Floor(NamedTuple):
    """The store and its sink, started: what the floor suite's session fixture holds."""

    sink: ListSink
    conn: sqlite3.Connection
    numbers: Iterator[int]


def start(path: Path) -> Floor:
    """The store at ``path``, and its sink, started."""
    writes = open_store(path)
    sink = ListSink()
    sink.handler = StoreHandler(path)
    return Floor(sink.start(), *writes)


def open_store(path: Path) -> Writes:
    """The store at ``path`` alone, without a sink (the sequence benchmark)."""
    conn = connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.executescript(SCHEMA)
    return Writes(conn, itertools.count(1))


def reserve(floor: Floor | Writes) -> tuple[str, int]:
    """A reserved alias and its fence."""
    number = next(floor.numbers)
    alias = f"{Contract().purpose}-{number}@mailbox.test"
    write(floor.conn, "INSERT INTO boxes (alias, state) VALUES (?, 'reserved')", (alias,))
    return alias, number


def claim_and_ack(floor: Floor | Writes, alias: str, fence: int) -> None:
    (row,) = write(
        floor.conn,
        "UPDATE mails SET state = 'claimed', fence = ? WHERE box = ? AND state = 'waiting'"
        " RETURNING id",
        (fence, alias),
    )
    write(
        floor.conn,
        "UPDATE mails SET state = 'consumed' WHERE id = ? AND fence = ?",
        (row[0], fence),
    )


def release(floor: Floor | Writes, alias: str) -> None:
    write(floor.conn, "UPDATE boxes SET state = 'released' WHERE alias = ?", (alias,))
