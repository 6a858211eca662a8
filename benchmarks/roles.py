"""The server-side processes of a benchmark: ``python benchmarks/roles.py ROLE [options]``.

Every role prints JSON lines on stdout and exits by itself (a server when its stdin closes).
The orchestrator (``run.py``) starts them, and the clients (``clients.py``) run apart, so a
client never shares a process, an event loop or a GIL with the server it measures.
"""

from __future__ import annotations

import argparse
import os
import queue
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks import floor
from benchmarks.clients import emit, role_command
from benchmarks.smtp import DOMAIN, SENDER, ListSink, mail
from pytest_mailbox.contract import EmailContract, dump_receipt
from pytest_mailbox.mailbox import Mailbox
from pytest_mailbox.sink import MailSink, Signal
from pytest_mailbox.store import Delivery, Store

CONTRACT = EmailContract(purpose="bench", ttl=600, lease=60, timeout=10)
CODE = r"the code (\d{6})"


def usage() -> dict[str, float]:
    """Resident set size now and at its peak (VmHWM) in KiB, from /proc; CPU seconds used."""
    found = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0])
    times = os.times()
    return {
        "rss_kb": found["VmRSS"],
        "peak_rss_kb": found["VmHWM"],
        "cpu_s": times.user + times.system,
    }


# -- server: a sink in its own process -------------------------------------------------


def server(kind: str, store_path: str, mailboxes: int) -> None:
    """Serve until stdin closes; report what was received and the process's memory."""
    addresses: list[str] = []
    if kind == "bare":
        bare = ListSink().start()
        port = bare.port

        def received() -> int:
            return len(bare.handler.messages)
    else:
        store = Store(store_path)
        sink = MailSink(store, domains=[DOMAIN], name=f"bench-{kind}").start()
        port = sink.port
        for _ in range(mailboxes):
            addresses.append(Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN).address)

        def received() -> int:
            return store.stats()["received"]

    if not addresses:
        addresses = [f"user{i}@{DOMAIN}" for i in range(mailboxes)]
    emit(port=port, addresses=addresses, **usage())
    sys.stdin.read()  # until the orchestrator closes our stdin
    emit(received=received(), **usage())


# -- waiter: wake-up latency -----------------------------------------------------------


class _ProbeSignal(Signal):
    """The in-process wake-up, telling when a waiter has scanned once and gone to sleep."""

    def __init__(self) -> None:
        super().__init__()
        self.asleep = threading.Event()

    def wait(self, seen: int, timeout: float) -> int:
        self.asleep.set()
        return super().wait(seen, timeout)


class _Feeder:
    """The feeder process, and a thread that hands it a mail once the waiter is asleep."""

    def __init__(self, port: int) -> None:
        self.proc = subprocess.Popen(
            role_command("feeder", "--port", port),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.requests: queue.Queue[tuple[threading.Event, str] | None] = queue.Queue()
        self.thread = threading.Thread(target=self._trigger, daemon=True)
        self.thread.start()

    def _trigger(self) -> None:
        assert self.proc.stdin is not None
        while (item := self.requests.get()) is not None:
            asleep, line = item
            if not asleep.wait(10):
                line += "-never-waited"  # the waiter then times out: the run fails loudly
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()

    def send_when(self, asleep: threading.Event, rcpt: str, subject: str) -> None:
        self.requests.put((asleep, f"{rcpt}\t{subject}"))

    def answer(self) -> tuple[float, float]:
        """When the last mail's end of DATA was sent, and when its 250 arrived."""
        assert self.proc.stdout is not None
        sent, answered = map(float, self.proc.stdout.readline().split())
        return sent, answered

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.requests.put(None)
        self.thread.join()
        self.proc.stdin.close()
        self.proc.wait(10)


def waiter(mode: str, store_path: str, port: int, count: int, warmup: int) -> None:
    """Measure 250-to-``wait_for``-return for ``count`` mails, each to a fresh mailbox
    (and end-of-DATA-sent-to-return, which stays positive for the floor).

    ``own``: the sink runs in this process; ``cross``: the sink at ``port`` is another
    process on the same store; ``bare``: the list sink and a condition variable (the floor).
    """
    store = Store(store_path)
    signal = _ProbeSignal()
    bare: ListSink | None = None
    sink: MailSink | None = None
    if mode == "own":
        sink = MailSink(store, domains=[DOMAIN], signal=signal, name="own").start()
        port = sink.port
    elif mode == "bare":
        bare = ListSink().start()
        port = bare.port
    feeder = _Feeder(port)
    latencies: list[float] = []
    from_sent: list[float] = []
    for i in range(warmup + count):
        subject = f"wake {i}"
        asleep = threading.Event()
        if bare is not None:
            feeder.send_when(asleep, f"user{i}@{DOMAIN}", subject)
            bare.handler.wait_for(subject, 10, asleep)
            returned = time.monotonic()
        else:
            box = Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN, signal=signal)
            signal.asleep = asleep
            feeder.send_when(asleep, box.address, subject)
            claimed = box.wait_for(subject=subject, timeout=10)
            returned = time.monotonic()
            claimed.ack()
            box.close(success=True)
        sent, answered = feeder.answer()
        if i >= warmup:
            latencies.append(returned - answered)
            from_sent.append(returned - sent)
    feeder.close()
    if sink is not None:
        sink.stop()
    if bare is not None:
        bare.stop()
    emit(latencies=latencies, from_sent=from_sent)


# -- claims: claim latency against a full store ----------------------------------------


def prefill(store: Store, sink: MailSink, count: int) -> None:
    """Put ``count`` finished runs in the store: mailbox released, message consumed.

    One run goes through the public API; its rows are then copied ``count`` times in one
    transaction (fresh ids, aliases and fence tokens), which is what 100,000 earlier
    tests would have left behind, without waiting for 500,000 transactions.
    """
    box = Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN)
    deliver(sink, box, "template")
    claimed = box.wait_for(subject="template", timeout=5)
    claimed.code(pattern=CODE)  # as most tests do: records the code's digest for the receipt
    claimed.ack()
    box.close(success=True)
    conn = store._conn()  # the benchmark reaches in: no public bulk-insert API exists

    def rows(table: str, column: str, value: object) -> list[dict[str, Any]]:
        cursor = conn.execute(f"SELECT * FROM {table} WHERE {column} = ?", (value,))
        return [dict(row) for row in cursor]

    (mbox,) = rows("mailboxes", "mailbox_id", box.mailbox_id)
    (message,) = rows("messages", "mailbox_id", box.mailbox_id)
    (body,) = rows("bodies", "body_id", message["body_id"])
    (claim,) = rows("claims", "mailbox_id", box.mailbox_id)
    events = rows("events", "mailbox_id", box.mailbox_id)
    found = rows("secrets", "mailbox_id", box.mailbox_id)
    fence0 = int(conn.execute("SELECT value FROM counters WHERE name = 'fence'").fetchone()[0])
    body0 = int(conn.execute("SELECT MAX(body_id) FROM bodies").fetchone()[0])
    tables: dict[str, list[dict[str, Any]]] = {
        "mailboxes": [],
        "bodies": [],
        "messages": [],
        "claims": [],
        "events": [],
        "secrets": [],
    }
    for i in range(count):
        mailbox_id, message_id = f"mbx-fill{i:07d}", f"m-fill{i:07d}"
        fence = fence0 + 2 * i + 2
        tables["mailboxes"].append(
            {
                **mbox,
                "mailbox_id": mailbox_id,
                "run_id": f"r-fill{i:07d}",
                "alias": f"fill-{i:07d}",
                "fence": fence - 1,
            }
        )
        tables["bodies"].append({**body, "body_id": body0 + 1 + i})
        tables["messages"].append(
            {
                **message,
                "seq": None,
                "message_id": message_id,
                "mailbox_id": mailbox_id,
                "body_id": body0 + 1 + i,
                "rcpt": f"fill-{i:07d}@{DOMAIN}",
                "alias": f"fill-{i:07d}",
                "fence": fence,
            }
        )
        tables["claims"].append(
            {**claim, "fence": fence, "message_id": message_id, "mailbox_id": mailbox_id}
        )
        tables["events"].extend({**event, "mailbox_id": mailbox_id} for event in events)
        tables["secrets"].extend(
            {**secret, "mailbox_id": mailbox_id, "message_id": message_id} for secret in found
        )
    conn.execute("BEGIN IMMEDIATE")
    for table, values in tables.items():
        if not values:
            continue
        columns = list(values[0])
        conn.executemany(
            f"INSERT INTO {table} ({','.join(columns)}) VALUES ({','.join('?' * len(columns))})",
            [tuple(v[c] for c in columns) for v in values],
        )
    conn.execute("UPDATE counters SET value = ? WHERE name = 'fence'", (fence0 + 2 * count,))
    conn.execute("COMMIT")


def deliver(sink: MailSink, box: Mailbox, subject: str) -> None:
    """Commit a mail to ``box`` exactly as the sink does after DATA (parse, store, notify)."""
    delivery = Delivery(rcpt=box.address, alias=box.alias, tag=None, domain=box.domain)
    sink.accept(SENDER, [delivery], mail(box.address, subject))


def claims(store_path: str, stored: int, samples: int, warmup: int) -> None:
    """With ``stored`` messages already in the store, time ``wait_for`` on a message that
    is already in its mailbox: the scan, the claim transaction and the body read. The
    rest of a test's store work (code, ack, close, receipt) is timed too, apart."""
    store = Store(store_path)
    sink = MailSink(store, domains=[DOMAIN], name="claims")  # never started: accept() only
    started = time.perf_counter()
    if stored:
        prefill(store, sink, stored)
    filled = time.perf_counter() - started
    latencies: list[float] = []
    rest: list[float] = []
    for i in range(warmup + samples):
        box = Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN, signal=sink.signal)
        deliver(sink, box, f"claim {i}")
        t0 = time.perf_counter()
        claimed = box.wait_for(subject=f"claim {i}", timeout=5)
        t1 = time.perf_counter()
        claimed.code(pattern=CODE)
        claimed.ack()
        box.close(success=True)
        box.receipt()
        t2 = time.perf_counter()
        if i >= warmup:
            latencies.append(t1 - t0)
            rest.append(t2 - t1)
    emit(latencies=latencies, rest=rest, stored=store.stats()["received"], fill_seconds=filled)


def costs(store_path: str, count: int) -> None:
    """CPU per mail of what the sink does after DATA, call by call, in one thread:
    ``MailSink.accept`` (parse, commit, notify) and, of that, ``Store.deliver``."""
    store = Store(store_path)
    sink = MailSink(store, domains=[DOMAIN], name="costs")  # never started: accept() only
    box = Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN)
    delivery = [Delivery(rcpt=box.address, alias=box.alias, tag=None, domain=box.domain)]
    raws = [mail(box.address, f"cost {i}") for i in range(count)]
    for raw in raws[:20]:  # warm-up
        sink.accept(SENDER, delivery, raw)
    t0 = time.process_time()
    for raw in raws:
        sink.accept(SENDER, delivery, raw)
    accept = (time.process_time() - t0) / count
    t0 = time.process_time()
    for raw in raws:
        store.deliver(
            mail_from=SENDER,
            deliveries=delivery,
            raw=raw,
            subject="cost",
            run_header=None,
            sink="costs",
        )
    deliver = (time.process_time() - t0) / count
    emit(accept_cpu=accept, deliver_cpu=deliver)


def sequence(directory: str, count: int, rounds: int) -> None:
    """CPU per test of what each suite's tests do with their store, and the wall time of
    each step, in one thread, no SMTP: pytest-mailbox's (reserve; the sink's parse, commit
    and notify; ``wait_for`` and its claim; ack; close, with the receipt its fixture writes
    to the report) and the floor suite's five writes (``benchmarks/floor.py``). The two
    take turns, ``count`` tests each per round. This is the part of a test's cost that the
    suites' wall times cannot tell apart from the machine's noise. Each suite's sink
    commits on a connection of its own, as in a run (the plugin's sink thread has its
    own): a commit there makes the test's connection read the pages it changed again."""
    base = Path(directory)
    base.mkdir(parents=True, exist_ok=True)
    store = Store(base / "mailbox.sqlite3")
    sink_store = Store(base / "mailbox.sqlite3")  # the sink's own connection
    sink = MailSink(sink_store, domains=[DOMAIN], name="sequence")  # never started: accept()
    least = floor.open_store(base / "floor.sqlite3")
    sink_side = floor.connect(base / "floor.sqlite3")  # the floor sink's own connection

    def mailbox_test(subject: str) -> Iterator[str]:
        box = Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN, signal=sink.signal)
        yield "reserve"
        deliver(sink, box, subject)
        yield "deliver"
        claimed = box.wait_for(subject=subject, timeout=5)
        yield "wait_for (claim)"
        claimed.ack()
        yield "ack"
        dump_receipt(box.close(success=True))
        yield "close + receipt"

    def floor_test(subject: str) -> Iterator[str]:
        alias, fence = floor.reserve(least)
        yield "reserve"
        floor.deliver(sink_side, alias)
        yield "deliver"
        floor.claim_and_ack(least, alias, fence)
        yield "claim + ack"
        floor.release(least, alias)
        yield "release"

    tests = {"mailbox": mailbox_test, "floor": floor_test}
    cpus: dict[str, list[float]] = {kind: [] for kind in tests}
    spent: dict[str, dict[str, list[float]]] = {kind: {} for kind in tests}
    try:
        for r in range(rounds):
            for kind in list(tests) if r % 2 == 0 else list(tests)[::-1]:
                for i in range(max(20, count // 10)):  # warm-up: caches, statements, pages
                    for _ in tests[kind](f"warm {r} {i}"):
                        pass
                steps: dict[str, float] = {}
                cpu = time.process_time()  # all threads: the store's checkpoints too
                for i in range(count):
                    start = time.perf_counter()
                    for step in tests[kind](f"sequence {r} {i}"):
                        now = time.perf_counter()
                        steps[step] = steps.get(step, 0.0) + now - start
                        start = now
                cpus[kind].append((time.process_time() - cpu) / count)
                for step, total in steps.items():
                    spent[kind].setdefault(step, []).append(total / count)
    finally:
        store.close()
        sink_store.close()
        least.conn.close()
        sink_side.close()
    emit(
        **{
            kind: {
                "cpu": statistics.median(cpus[kind]),
                "steps": {step: statistics.median(v) for step, v in spent[kind].items()},
            }
            for kind in tests
        }
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="roles.py")
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("server")
    p.add_argument("--kind", choices=["bare", "mailbox"], required=True)
    p.add_argument("--store", default="")
    p.add_argument("--mailboxes", type=int, default=1)
    p = roles.add_parser("waiter")
    p.add_argument("--mode", choices=["own", "cross", "bare"], required=True)
    p.add_argument("--store", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--warmup", type=int, default=20)
    p = roles.add_parser("claims")
    p.add_argument("--store", required=True)
    p.add_argument("--stored", type=int, required=True)
    p.add_argument("--samples", type=int, required=True)
    p.add_argument("--warmup", type=int, default=10)
    p = roles.add_parser("costs")
    p.add_argument("--store", required=True)
    p.add_argument("--count", type=int, required=True)
    p = roles.add_parser("sequence")
    p.add_argument("--dir", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args(argv)
    if args.role == "server":
        server(args.kind, args.store, args.mailboxes)
    elif args.role == "waiter":
        waiter(args.mode, args.store, args.port, args.count, args.warmup)
    elif args.role == "claims":
        claims(args.store, args.stored, args.samples, args.warmup)
    elif args.role == "costs":
        costs(args.store, args.count)
    else:
        sequence(args.dir, args.count, args.rounds)


if __name__ == "__main__":
    main()
