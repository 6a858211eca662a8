"""The store's contract against a model of it: hypothesis runs random sequences of calls.

A ``RuleBasedStateMachine`` drives one real store (a SQLite file in ``tmp_path``, on the
hand-moved clock of ``storekit``) through reservations, deliveries (the store's ingest
call, as the sink commits, and real SMTP through a real sink), claims by id and by
selector (``Mailbox.wait_for``), acks, renewals and releases of claims (from the store, and
through ``Mailbox``, whose refusals raise their typed errors), releases and teardowns of
mailboxes, the clock running out leases and ttls, and reconciliation. A few lines of
Python say what docs/contract.md promises for each call; after every step the file itself
is read and held to the model and to the invariants:

- every delivered message is in the store, in exactly one state, routed as it was sent:
  nothing is lost, and a mailbox never sees another's mail;
- no message is held by two live leases, and the live one is the message's own fence;
- a message's fences strictly increase, each from the one store-wide counter;
- an acked message is consumed once and never handed out again;
- two candidates are ``ambiguous``, never a guess.
"""

from __future__ import annotations

import shutil
import smtplib
import sqlite3
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
    run_state_machine_as_test,
)
from storekit import DOMAIN, Clock

from pytest_mailbox import (
    AlreadyConsumed,
    AmbiguousMatch,
    EmailContract,
    FenceMismatch,
    LeaseExpired,
    Mailbox,
    MailboxClosed,
    MailboxError,
    WaitTimeout,
)
from pytest_mailbox.contract import CloseReason, Status
from pytest_mailbox.sink import MailSink
from pytest_mailbox.store import ACTIVE, Delivery, Handle, Incoming, Outcome, Store
from pytest_mailbox.vocabulary import utc

#: Runs that reserve; a second reserve of one while its mailbox is open finds it again.
RUNS = ("r-a", "r-b", "r-c")
#: A claimer that is not the mailbox's own run (another holder of the same mailbox).
INTRUDER = "r-intruder"
#: A run id that mail may name in its X-Run-Id header and no mailbox has.
STRANGER = "r-stranger"
SUBJECTS = ("Verify", "Welcome")
#: Another test domain of the sink: an alias there is another address, and unrouted.
OTHER_DOMAIN = "other.test"
#: No test domain of the sink: refused at RCPT, nothing stored.
REFUSED_DOMAIN = "elsewhere.example"
#: An alias no mailbox has: its mail is kept, unrouted.
GHOST = "ghost"
TTLS = (30, 120, 600)
LEASES = (5, 10, 60)  # 60: past a ttl of 30, a lease ends with its mailbox

#: The typed error a refusal of a claim's holder raises; any other status is MailboxClosed's.
TYPED: dict[Status, type[MailboxError]] = {
    Status.ALREADY_CONSUMED: AlreadyConsumed,
    Status.FENCE_MISMATCH: FenceMismatch,
    Status.LEASE_EXPIRED: LeaseExpired,
}

MODEL = settings(
    max_examples=100,
    stateful_step_count=40,
    deadline=None,
    database=None,
    derandomize=True,  # the same sequences on every run and machine: CI stays deterministic
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Box:
    """A reservation, as the model sees it."""

    mailbox_id: str
    run_id: str
    alias: str
    fence: int
    expires_at: float
    handle: Mailbox
    closed: str | None = None  # the close reason of a release
    rank: int = 0  # its state while open, as an index of ACTIVE: states only move forward
    since: int | None = None  # the seq of its last checkpoint()


@dataclass
class Msg:
    """A delivered copy, as the model sees it."""

    message_id: str
    mailbox_id: str | None  # None: unrouted
    seq: int
    received_at: float
    subject: str
    tag: str | None
    run_header: str | None
    claim: str | None = None  # None (never claimed), held, released or consumed
    fence: int | None = None  # of the last claim granted
    holder: str | None = None
    lease_until: float | None = None

    def live(self, now: float) -> bool:
        return self.claim == "held" and self.lease_until is not None and self.lease_until > now


@dataclass(frozen=True)
class Ticket:
    """What a granted claim gave its holder: the message and the fence that proves it."""

    message_id: str
    fence: int
    holder: str


class StoreModel(RuleBasedStateMachine):
    mailboxes = Bundle("mailboxes")
    messages = Bundle("messages")
    tickets = Bundle("tickets")

    def __init__(self, root: Path) -> None:
        super().__init__()
        self.path = Path(tempfile.mkdtemp(dir=root)) / "mailbox.sqlite3"
        self.clock = Clock()
        self.store = Store(self.path, clock=self.clock)
        self.sink: MailSink | None = None
        # Reads the file itself, bypassing the store under test (autocommit: each statement
        # sees the latest commit). Reads through the store would reconcile as they go.
        self.db = sqlite3.connect(self.path, isolation_level=None)
        self.fences = 0  # the store-wide counter, as the model counts it
        self.seq = 0  # the last message row's seq
        self.boxes: dict[str, Box] = {}
        self.msgs: dict[str, Msg] = {}
        self.granted: dict[str, list[int]] = {}  # each message's fences, in the order given

    def teardown(self) -> None:
        if self.sink is not None:
            self.sink.stop()
        self.db.close()
        self.store.close()
        # A hundred stores a run: the steps hypothesis prints reproduce a failure.
        shutil.rmtree(self.path.parent, ignore_errors=True)

    # -- the model's rules -----------------------------------------------------------------

    @property
    def now(self) -> float:
        return self.clock.now

    def closed_status(self, box: Box) -> Status | None:
        """Why the mailbox refuses everything now, or None while it is open."""
        if box.closed is not None:
            return Status.RELEASED
        if box.expires_at <= self.now:
            return Status.EXPIRED
        return None

    def advance(self, box: Box, status: Status) -> None:
        box.rank = max(box.rank, ACTIVE.index(status.value))

    def expected_on_claim(self, message_id: str, fence: int, handle: Handle | None) -> Status:
        """What ack, renew and release_claim answer for ``fence`` (docs/contract.md's table)."""
        msg = self.msgs[message_id]
        if msg.mailbox_id is None or (handle is not None and handle.mailbox_id != msg.mailbox_id):
            return Status.POLICY_DENIED
        box = self.boxes[msg.mailbox_id]
        closed = self.closed_status(box)
        if closed is not None:
            return closed
        if handle is not None and handle.fence != box.fence:
            return Status.FENCE_MISMATCH
        if msg.claim == "consumed":
            return Status.ALREADY_CONSUMED if fence == msg.fence else Status.FENCE_MISMATCH
        if msg.claim != "held" or fence != msg.fence:
            return Status.FENCE_MISMATCH
        if not msg.live(self.now):
            return Status.LEASE_EXPIRED
        return Status.CLAIMED

    def candidates(
        self, box: Box, subject: str | None, tag: str | None, after: float | None
    ) -> list[Msg]:
        """What a wait for this selector may take (docs/contract.md, Match)."""
        found = []
        for msg in sorted(self.msgs.values(), key=lambda m: m.seq):
            if msg.mailbox_id != box.mailbox_id:
                continue
            if after is None and box.since is not None and msg.seq <= box.since:
                continue
            if after is not None and msg.received_at < after:
                continue
            if msg.run_header is not None and msg.run_header != box.run_id:
                continue
            if msg.claim == "consumed" or msg.live(self.now):
                continue
            if subject is not None and msg.subject != subject:
                continue
            if tag is not None and (msg.tag or "") != tag:
                continue
            found.append(msg)
        return found

    def grant(self, msg: Msg, fence: int | None, holder: str, lease: float) -> Ticket:
        """A claim the store granted: check its fence and lease, and hold it in the model."""
        box = self.boxes[str(msg.mailbox_id)]
        assert fence == self.fences + 1, "a fence comes from the one store-wide counter"
        assert all(earlier < fence for earlier in self.granted.setdefault(msg.message_id, []))
        self.fences = fence
        self.granted[msg.message_id].append(fence)
        msg.claim, msg.fence, msg.holder = "held", fence, holder
        msg.lease_until = min(self.now + lease, box.expires_at)
        self.advance(box, Status.CLAIMED)
        return Ticket(msg.message_id, fence, holder)

    def register(self, rows: list[tuple[Any, ...]]) -> list[str]:
        """Messages the store committed: (seq, message_id, mailbox_id, alias, tag, domain,
        subject, run_header, received_at), in seq order."""
        for seq, message_id, mailbox_id, _, tag, _, subject, run_header, received_at in rows:
            assert seq == self.seq + 1, "seq only ever grows, one a row"
            self.seq = seq
            self.msgs[message_id] = Msg(
                message_id, mailbox_id, seq, received_at, subject, tag, run_header
            )
        return [row[1] for row in rows]

    def routed_to(self, alias: str, domain: str) -> str | None:
        """The mailbox mail to ``alias@domain`` goes to: by exact alias, open or closed."""
        for box in self.boxes.values():
            if box.alias == alias and domain == DOMAIN:
                return box.mailbox_id
        return None

    def new_rows(self) -> list[tuple[Any, ...]]:
        return self.db.execute(
            "SELECT seq, message_id, mailbox_id, alias, tag, domain, subject, run_header, "
            "received_at FROM messages WHERE seq > ? ORDER BY seq",
            (self.seq,),
        ).fetchall()

    def check_routing(
        self, rows: list[tuple[Any, ...]], sent: list[tuple[str, str | None, str]]
    ) -> None:
        """Each recipient sent to has one copy, in order, routed by its exact alias."""
        # An empty tag (``alias+@domain``) is mail to the alias alone.
        assert [(alias, tag or None, domain) for _, _, _, alias, tag, domain, *_ in rows] == sent
        for (alias, _, domain), row in zip(sent, rows, strict=True):
            assert row[2] == self.routed_to(alias, domain)
            assert row[8] == self.now

    # -- reservations ----------------------------------------------------------------------

    @initialize(target=mailboxes, ttl=st.sampled_from(TTLS))
    def first_reservation(self, ttl: int) -> Any:
        """A mailbox from the start: rules on mailboxes and messages can run at once, and
        the swarm of rules hypothesis turns off never leaves nothing to do."""
        return self.reserve(RUNS[0], ttl)

    @rule(target=mailboxes, run_id=st.sampled_from(RUNS), ttl=st.sampled_from(TTLS))
    def reserve(self, run_id: str, ttl: int) -> Any:
        open_ = [
            box
            for box in self.boxes.values()
            if box.run_id == run_id and self.closed_status(box) is None
        ]
        row, created = self.store.reserve(run_id=run_id, purpose="verify", ttl=ttl, domain=DOMAIN)
        if open_:  # idempotent while open: never a second address
            assert (row.mailbox_id, row.alias, created) == (
                open_[0].mailbox_id,
                open_[0].alias,
                False,
            )
            return row.mailbox_id
        assert created
        assert row.mailbox_id not in self.boxes
        assert row.fence == self.fences + 1
        self.fences = row.fence
        assert (row.expires_at, row.state) == (self.now + ttl, "reserved")
        contract = EmailContract(purpose="verify", ttl=ttl, lease=min(LEASES))
        handle = Mailbox(self.store, row, contract=contract)
        self.boxes[row.mailbox_id] = Box(
            row.mailbox_id, run_id, row.alias, row.fence, row.expires_at, handle
        )
        return row.mailbox_id

    @rule(
        mailbox_id=consumes(mailboxes),
        how=st.sampled_from(
            ("released_success", "released_error", "stale", "close passed", "close failed")
        ),
    )
    def end(self, mailbox_id: str, how: str) -> None:
        """A release (as the test's code or an agent ends a mailbox; by a stale handle,
        refused), or a test's teardown."""
        if how.startswith("close"):
            self.close(mailbox_id, success=how == "close passed")
        elif how == "stale":
            self.release(mailbox_id, CloseReason.RELEASED_SUCCESS, stale=True)
        else:
            self.release(mailbox_id, CloseReason(how), stale=False)

    def release(self, mailbox_id: str, reason: CloseReason, *, stale: bool) -> None:
        box = self.boxes[mailbox_id]
        fence = box.fence - 1 if stale else box.fence
        outcome = self.store.release(mailbox_id, fence, reason)
        closed = self.closed_status(box)
        if stale:
            assert outcome.status is Status.FENCE_MISMATCH
        elif closed is not None:
            assert outcome.status is closed  # every later operation is refused, a release too
        else:
            assert (outcome.status, outcome.detail) == (Status.RELEASED, reason.value)
            box.closed = reason.value
            for msg in self.msgs.values():  # its claims end with it
                if msg.mailbox_id == mailbox_id and msg.claim == "held":
                    msg.claim = "released"

    def close(self, mailbox_id: str, *, success: bool) -> None:
        """A test's teardown: a pass acks the run's live claims and releases as a success;
        a failure gives them back and releases as an error, or turns an earlier release as
        a success into one as an error. A closed mailbox is left as it is."""
        box = self.boxes[mailbox_id]
        closed = self.closed_status(box)
        receipt = box.handle.close(success=success)
        if closed is None:
            for msg in self.msgs.values():
                if msg.mailbox_id == mailbox_id and msg.claim == "held":
                    mine = success and msg.holder == box.run_id and msg.live(self.now)
                    msg.claim = "consumed" if mine else "released"
                    if mine:
                        self.advance(box, Status.CONSUMED)
            box.closed = (
                CloseReason.RELEASED_SUCCESS if success else CloseReason.RELEASED_ERROR
            ).value
        elif not success and box.closed == CloseReason.RELEASED_SUCCESS.value:
            box.closed = CloseReason.RELEASED_ERROR.value
        closed = self.closed_status(box)
        assert closed is not None
        assert (receipt.state, receipt.close_reason) == (
            closed.value,
            box.closed or CloseReason.EXPIRED_TIMEOUT.value,
        )
        states = {m.message_id: m.state for m in receipt.messages}
        assert set(states) == {
            m.message_id for m in self.msgs.values() if m.mailbox_id == mailbox_id
        }
        for message_id, state in states.items():
            assert (state == "consumed") is (self.msgs[message_id].claim == "consumed")

    @rule(mailbox_id=mailboxes)
    def checkpoint(self, mailbox_id: str) -> None:
        box = self.boxes[mailbox_id]
        closed = self.closed_status(box)
        if closed is not None:
            with pytest.raises(MailboxClosed) as refused:
                box.handle.checkpoint()
            assert refused.value.status is closed
            return
        assert box.handle.checkpoint().seq == self.seq
        box.since = self.seq

    # -- the clock -------------------------------------------------------------------------

    @rule(seconds=st.sampled_from((0, 1, 5, 10, 30)), reconcile=st.booleans())
    def time_passes(self, seconds: int, reconcile: bool) -> None:
        """The clock moves; a reconciliation ends every overdue lease and mailbox, and a
        second one changes nothing."""
        self.clock.advance(seconds)
        if not reconcile:
            return
        self.store.reconcile()
        before = self.dump()
        assert self.store.reconcile() == {"mailboxes": 0, "leases": 0}
        assert self.dump() == before
        now = self.now
        overdue_leases = self.db.execute(
            "SELECT message_id FROM messages WHERE state = 'claimed' AND lease_until <= ?", (now,)
        )
        assert overdue_leases.fetchall() == []
        overdue_mailboxes = self.db.execute(
            "SELECT mailbox_id FROM mailboxes WHERE closed_at IS NULL AND expires_at <= ?", (now,)
        )
        assert overdue_mailboxes.fetchall() == []

    # -- deliveries ------------------------------------------------------------------------

    @rule(
        target=messages,
        first=mailboxes,
        second=mailboxes,
        to=st.lists(
            st.tuples(
                st.booleans(),  # to the second mailbox, not the first
                st.sampled_from((None, "friend")),
                st.sampled_from(("alias", "alias", "alias", "ghost", "other domain")),
            ),
            min_size=1,
            max_size=3,
        ),
        subject=st.sampled_from(SUBJECTS),
        run_header=st.sampled_from((None, "first", STRANGER)),
    )
    def deliver(
        self,
        first: str,
        second: str,
        to: list[tuple[bool, str | None, str]],
        subject: str,
        run_header: str | None,
    ) -> Any:
        """One message for several recipients (of two mailboxes, an unknown alias, another
        domain), committed as the sink commits it."""
        sent: list[tuple[str, str | None, str]] = []
        for to_second, tag, where in to:
            alias = GHOST if where == "ghost" else self.boxes[second if to_second else first].alias
            parts = (alias, tag, OTHER_DOMAIN if where == "other domain" else DOMAIN)
            if parts not in sent:  # the sink stores one copy per recipient
                sent.append(parts)
        if run_header == "first":
            run_header = self.boxes[first].run_id
        raw = f"Subject: {subject}\r\n\r\nbody\r\n".encode()
        deliveries = [Delivery(f"{a}{'+' + t if t else ''}@{d}", a, t, d) for a, t, d in sent]
        incoming = Incoming("noreply@app.example.test", deliveries, raw, subject, run_header)
        [ids] = self.store.deliver_all([incoming], sink="model")
        rows = self.new_rows()
        assert [row[1] for row in rows] == ids
        self.check_routing(rows, sent)
        return multiple(*self.register(rows))

    @rule(
        target=messages,
        mailbox_id=mailboxes,
        tag=st.sampled_from((None, "friend", "")),
        shout=st.booleans(),
        twice=st.booleans(),
        ghost=st.booleans(),
        refused=st.booleans(),
        subject=st.sampled_from(SUBJECTS),
        own_run=st.booleans(),
    )
    def deliver_by_smtp(
        self,
        mailbox_id: str,
        tag: str | None,
        shout: bool,
        twice: bool,
        ghost: bool,
        refused: bool,
        subject: str,
        own_run: bool,
    ) -> Any:
        """Real SMTP through a real sink: the recipient in any spelling, named twice (one
        copy; ``alias+@domain``, an empty tag, is the alias alone), beside an unknown alias
        (kept unrouted) and another domain (refused)."""
        if self.sink is None:
            self.sink = MailSink(self.store, domains=[DOMAIN, OTHER_DOMAIN]).start()
        box = self.boxes[mailbox_id]
        local = box.alias if tag is None else f"{box.alias}+{tag}"
        rcpts = [f"{local.upper() if shout else local}@{DOMAIN}"]
        if twice:
            again = box.alias if tag == "" else local
            rcpts.append(f"{again.upper() if not shout else again}@{DOMAIN.upper()}")
        sent: list[tuple[str, str | None, str]] = [(box.alias, tag or None, DOMAIN)]
        if ghost:
            rcpts.append(f"{GHOST}@{DOMAIN}")
            sent.append((GHOST, None, DOMAIN))
        if refused:
            rcpts.append(f"{box.alias}@{REFUSED_DOMAIN}")
        run_header = box.run_id if own_run else STRANGER
        raw = (
            f"From: noreply@app.example.test\r\nTo: {rcpts[0]}\r\nSubject: {subject}\r\n"
            f"X-Run-Id: {run_header}\r\n\r\nbody\r\n"
        ).encode()
        with smtplib.SMTP(self.sink.host, self.sink.port, timeout=30) as client:
            answered = client.sendmail("noreply@app.example.test", rcpts, raw)
        assert set(answered) == ({f"{box.alias}@{REFUSED_DOMAIN}"} if refused else set())
        assert all(code == 550 for code, _ in answered.values())
        rows = self.new_rows()  # the sink answers 250 only once the message is committed
        self.check_routing(rows, sent)
        assert {(row[6], row[7]) for row in rows} == {(subject, run_header)}
        return multiple(*self.register(rows))

    # -- claims ----------------------------------------------------------------------------

    @rule(
        target=tickets,
        message_id=messages,
        through=st.sampled_from(("own", "own", "own", "other", "stale")),
        other=mailboxes,
        intruder=st.booleans(),
        lease=st.sampled_from(LEASES),
    )
    def claim(self, message_id: str, through: str, other: str, intruder: bool, lease: int) -> Any:
        """A claim by id, by the mailbox's run or another claimer, through its own mailbox,
        another (unrouted mail: through any), or a stale handle of its own."""
        msg = self.msgs[message_id]
        mailbox_id = msg.mailbox_id if through != "other" and msg.mailbox_id else other
        return self.claim_through(mailbox_id, message_id, through, intruder, lease)

    @rule(
        target=tickets,
        ticket=tickets,
        intruder=st.booleans(),
        lease=st.sampled_from(LEASES),
    )
    def claim_again(self, ticket: Ticket, intruder: bool, lease: int) -> Any:
        """A claimed message claimed again, through its mailbox: by its holder or another
        claimer, while the lease lives (refused), after it lapsed or was given back (a new,
        higher fence), or after its ack (never handed out again)."""
        mailbox_id = str(self.msgs[ticket.message_id].mailbox_id)
        return self.claim_through(mailbox_id, ticket.message_id, "own", intruder, lease)

    @rule(target=tickets, ticket=tickets, call=st.sampled_from(("ack", "renew", "release_claim")))
    def holder_pauses(self, ticket: Ticket, call: str) -> Any:
        """A holder stops (a GC pause, a debugger) until its lease ends, to the instant;
        another claimer takes the message under a higher fence; the holder wakes and acts
        on its claim, which is refused and changes nothing."""
        msg = self.msgs[ticket.message_id]
        if msg.live(self.now):
            assert msg.lease_until is not None
            self.clock.advance(msg.lease_until - self.now)
        mailbox_id = str(msg.mailbox_id)
        taken = self.claim_through(mailbox_id, ticket.message_id, "own", True, min(LEASES))
        self.on_claim(
            call,
            ticket,
            ticket.message_id,
            self.handle_for(ticket.message_id, "own", mailbox_id),
            min(LEASES),
        )
        return taken

    def claim_through(
        self, mailbox_id: str, message_id: str, through: str, intruder: bool, lease: int
    ) -> Any:
        msg = self.msgs[message_id]
        box = self.boxes[mailbox_id]
        holder = INTRUDER if intruder else box.run_id
        outcome = self.store.claim(
            mailbox_id=mailbox_id,
            mailbox_fence=box.fence - 1 if through == "stale" else box.fence,
            message_id=message_id,
            holder=holder,
            lease=lease,
        )
        closed = self.closed_status(box)
        if through == "stale":  # a handle's fence is checked first
            assert outcome.status is Status.FENCE_MISMATCH
        elif closed is not None:
            assert outcome.status is closed
        elif msg.mailbox_id != mailbox_id:  # another mailbox's, or unrouted: never visible
            assert outcome.status is Status.POLICY_DENIED
        elif msg.claim == "consumed":  # never handed out again
            assert outcome.status is Status.ALREADY_CONSUMED
            assert outcome.holder == msg.holder
            assert outcome.fence == (msg.fence if holder == msg.holder else None)
        elif msg.live(self.now):
            assert outcome.status is Status.ALREADY_CLAIMED
            assert (outcome.holder, outcome.lease_until) == (msg.holder, msg.lease_until)
            # The fence is its holder's proof: only the holder gets it back.
            assert outcome.fence == (msg.fence if holder == msg.holder else None)
        else:
            assert outcome.status is Status.CLAIMED, outcome
            ticket = self.grant(msg, outcome.fence, holder, lease)
            assert (outcome.holder, outcome.lease_until) == (holder, msg.lease_until)
            return ticket
        return multiple()

    @rule(
        target=tickets,
        mailbox_id=mailboxes,
        subject=st.sampled_from((None, None, *SUBJECTS)),
        tag=st.sampled_from((None, None, "", "friend")),
        after=st.sampled_from((None, None, None, 0, 5, 30)),
        lease=st.sampled_from(LEASES),
    )
    def wait_for(
        self,
        mailbox_id: str,
        subject: str | None,
        tag: str | None,
        after: int | None,
        lease: int,
    ) -> Any:
        """A claim by selector: exactly one candidate is claimed, none times out, two or
        more are ambiguous and nothing is claimed."""
        box = self.boxes[mailbox_id]
        selector: dict[str, Any] = {"subject": subject, "tag": tag}
        since = None if after is None else self.now - after
        if since is not None:
            selector["received_after"] = since
        selector = {key: value for key, value in selector.items() if value is not None}
        closed = self.closed_status(box)
        if closed is not None:
            with pytest.raises(MailboxClosed) as refused:
                box.handle.wait_for(timeout=0, lease=lease, **selector)
            assert refused.value.status is closed
            return multiple()
        expected = self.candidates(box, subject, tag, since)
        self.advance(box, Status.WAITING)
        if not expected:
            with pytest.raises(WaitTimeout):
                box.handle.wait_for(timeout=0, lease=lease, **selector)
            return multiple()
        if len(expected) > 1:
            with pytest.raises(AmbiguousMatch) as ambiguous:
                box.handle.wait_for(timeout=0, lease=lease, **selector)
            assert sorted(ambiguous.value.result["message_ids"]) == sorted(
                m.message_id for m in expected
            )
            return multiple()
        claimed = box.handle.wait_for(timeout=0, lease=lease, **selector)
        [msg] = expected
        assert claimed.message_id == msg.message_id
        ticket = self.grant(msg, claimed.fence, box.run_id, lease)
        assert msg.lease_until is not None
        assert claimed.lease_until == utc(msg.lease_until)
        return ticket

    def through_mailbox(
        self, call: str, mailbox_id: str, message_id: str, fence: int, lease: int, expected: Status
    ) -> Outcome:
        """The call through the ``Mailbox`` a test holds: a refusal raises its typed error."""
        mailbox = self.boxes[mailbox_id].handle
        calls = {
            "ack": lambda: mailbox.ack(message_id, fence),
            "renew": lambda: mailbox.renew(message_id, fence, lease),
            "release_claim": lambda: mailbox.release_claim(message_id, fence),
        }
        if expected is Status.CLAIMED:
            return calls[call]()
        error = TYPED.get(expected, MailboxClosed)
        with pytest.raises(error) as refused:
            calls[call]()
        assert type(refused.value) is error
        assert refused.value.result["status"] == refused.value.status.value
        return Outcome(refused.value.status, message_id, fence=refused.value.result.get("fence"))

    def on_claim(
        self,
        call: str,
        ticket: Ticket,
        message_id: str,
        handle: Handle | None,
        lease: int,
        *,
        api: bool = False,
    ) -> Outcome:
        """ack, renew or release_claim of ``message_id`` with the ticket's fence: from the
        store, or through the handle's ``Mailbox`` (``api``)."""
        msg = self.msgs[message_id]
        expected = self.expected_on_claim(message_id, ticket.fence, handle)
        if api:
            assert handle is not None
            outcome = self.through_mailbox(
                call, handle.mailbox_id, message_id, ticket.fence, lease, expected
            )
        elif call == "ack":
            outcome = self.store.ack(message_id, ticket.fence, mailbox=handle)
        elif call == "renew":
            outcome = self.store.renew(message_id, ticket.fence, lease, mailbox=handle)
        else:
            outcome = self.store.release_claim(message_id, ticket.fence, mailbox=handle)
        if expected is not Status.CLAIMED:
            assert outcome.status is expected, (call, outcome)
            # A refusal names the fence presented, never the current one.
            assert outcome.fence in (None, ticket.fence)
            return outcome
        box = self.boxes[str(msg.mailbox_id)]
        if call == "ack":
            assert outcome.status is Status.CONSUMED
            msg.claim = "consumed"
            self.advance(box, Status.CONSUMED)
        elif call == "renew":
            assert msg.lease_until is not None
            msg.lease_until = max(msg.lease_until, min(self.now + lease, box.expires_at))
            assert (outcome.status, outcome.lease_until) == (Status.CLAIMED, msg.lease_until)
        else:
            assert outcome.status is Status.WAITING
            msg.claim = "released"
        assert outcome.fence == ticket.fence
        return outcome

    def handle_for(self, message_id: str, via: str, other: str) -> Handle | None:
        msg = self.msgs[message_id]
        if via == "none" or (via in ("borrowed", "mailbox") and msg.mailbox_id is None):
            return None
        mailbox_id = other if via == "other" or msg.mailbox_id is None else msg.mailbox_id
        return Handle(mailbox_id, self.boxes[mailbox_id].fence)

    @rule(
        ticket=tickets,
        call=st.sampled_from(("ack", "ack", "renew", "release_claim")),
        via=st.sampled_from(("own", "mailbox", "none", "other", "borrowed")),
        other=mailboxes,
        message_id=messages,
        lease=st.sampled_from(LEASES),
    )
    def act_on_claim(
        self, ticket: Ticket, call: str, via: str, other: str, message_id: str, lease: int
    ) -> None:
        """An ack (twice, late, after a newer holder), a renewal or a release of a claim,
        through the message's mailbox, none, another; or its fence borrowed for another
        message, through that message's mailbox."""
        if via != "borrowed":
            message_id = ticket.message_id
        handle = self.handle_for(message_id, via, other)
        self.on_claim(call, ticket, message_id, handle, lease, api=via == "mailbox")

    # -- invariants ------------------------------------------------------------------------

    def dump(self) -> dict[str, list[tuple[Any, ...]]]:
        return {
            table: self.db.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            for table in ("counters", "mailboxes", "messages", "claims")
        }

    @invariant()
    def every_message_is_in_exactly_one_state(self) -> None:
        now = self.now
        rows = self.db.execute(
            "SELECT seq, message_id, mailbox_id, state, fence, holder, lease_until "
            "FROM messages ORDER BY seq"
        ).fetchall()
        assert [row[1] for row in rows] == sorted(self.msgs, key=lambda i: self.msgs[i].seq)
        for seq, message_id, mailbox_id, state, fence, holder, lease_until in rows:
            msg = self.msgs[message_id]
            assert (seq, mailbox_id) == (msg.seq, msg.mailbox_id)
            assert state in ("waiting", "claimed", "consumed")
            if state == "consumed":
                assert (msg.claim, fence) == ("consumed", msg.fence)
            elif state == "claimed" and lease_until > now:
                assert msg.live(now)
                assert (fence, holder, lease_until) == (msg.fence, msg.holder, msg.lease_until)
            else:  # waiting, or a lapsed lease not yet noticed: free to claim
                assert msg.claim != "consumed"
                assert not msg.live(now)

    @invariant()
    def leases_are_exclusive_and_fenced(self) -> None:
        now = self.now
        claims: dict[str, list[tuple[int, str, float]]] = {}
        for fence, message_id, state, lease_until in self.db.execute(
            "SELECT fence, message_id, state, lease_until FROM claims ORDER BY fence"
        ):
            claims.setdefault(message_id, []).append((fence, state, lease_until))
        assert set(claims) == {m for m, fences in self.granted.items() if fences}
        for message_id, held in claims.items():
            msg = self.msgs[message_id]
            # Exactly the fences the model saw granted, in the order it saw them.
            assert [fence for fence, _, _ in held] == self.granted[message_id]
            live = [fence for fence, state, until in held if state == "claimed" and until > now]
            assert len(live) <= 1, f"{message_id} is held by two live leases: {live}"
            assert live == ([msg.fence] if msg.live(now) else [])
            consumed = [fence for fence, state, _ in held if state == "consumed"]
            assert consumed == ([msg.fence] if msg.claim == "consumed" else [])
            if consumed:  # an acked message is never handed out again
                assert held[-1][0] == consumed[0]
        [(counter,)] = self.db.execute("SELECT value FROM counters WHERE name = 'fence'")
        assert counter == self.fences

    @invariant()
    def a_mailbox_sees_its_own_mail_only(self) -> None:
        for box in self.boxes.values():
            own = {m.message_id for m in self.msgs.values() if m.mailbox_id == box.mailbox_id}
            assert {row.message_id for row in self.store.messages(box.mailbox_id)} == own

    @invariant()
    def mailboxes_are_in_their_states(self) -> None:
        now = self.now
        rows = self.db.execute(
            "SELECT mailbox_id, state, close_reason, closed_at FROM mailboxes"
        ).fetchall()
        assert {row[0] for row in rows} == set(self.boxes)
        for mailbox_id, state, close_reason, closed_at in rows:
            box = self.boxes[mailbox_id]
            closed = self.closed_status(box)
            if closed is Status.RELEASED:
                assert (state, close_reason) == ("released", box.closed)
            elif closed is Status.EXPIRED:  # expired, or overdue and not reconciled yet
                assert (state, close_reason) in (
                    ("expired", CloseReason.EXPIRED_TIMEOUT.value),
                    (ACTIVE[box.rank], None),
                )
                assert state == "expired" or closed_at is None
            else:
                assert (state, close_reason, closed_at) == (ACTIVE[box.rank], None, None)
                assert box.expires_at > now


def test_the_store_keeps_its_contract_under_any_sequence_of_calls(tmp_path: Path) -> None:
    run_state_machine_as_test(lambda: StoreModel(tmp_path), settings=MODEL)
