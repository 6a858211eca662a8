"""The consumption contract: claims under leases, fencing tokens, acks, renewals.

The first part drives one store with a hand-moved clock. The second part races real
processes (``spawn``) on one SQLite file: exactly one claimer wins, fences strictly
increase, a paused holder's late ack is refused, and no message is consumed twice.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import time
from collections.abc import Callable
from multiprocessing.synchronize import Barrier, Event
from pathlib import Path
from typing import Any

import pytest
from storekit import DOMAIN, Clock, claim, fence_counter, rows, snapshot

from pytest_mailbox import EmailContract, Mailbox, WaitTimeout
from pytest_mailbox.contract import CloseReason, Status
from pytest_mailbox.store import Delivery, MailboxRow, Store

#: Upper bound for a cross-process hand-off; only reached if something hangs.
HANG = 120.0


def reserve(
    store: Store, run_id: str = "run-1", purpose: str = "verify", ttl: float = 600
) -> MailboxRow:
    row, _ = store.reserve(run_id=run_id, purpose=purpose, ttl=ttl, domain=DOMAIN)
    return row


def deliver(store: Store, mailbox: MailboxRow, subject: str = "Verify") -> str:
    """Put one message in ``mailbox`` the way the sink does; its message id."""
    [message_id] = store.deliver(
        mail_from="noreply@app.example.test",
        deliveries=[
            Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
        ],
        raw=f"Subject: {subject}\r\n\r\nbody\r\n".encode(),
        subject=subject,
        run_header=None,
    )
    return message_id


def assert_consumed_at_most_once(db: Path) -> None:
    """The invariant: ≤1 consumed claim per message, and it is the message's own fence."""
    assert (
        rows(
            db,
            "SELECT message_id, COUNT(*) FROM claims WHERE state = 'consumed' "
            "GROUP BY message_id HAVING COUNT(*) > 1",
        )
        == []
    )
    assert (
        rows(
            db,
            "SELECT m.message_id FROM messages m WHERE m.state = 'consumed' AND NOT EXISTS "
            "(SELECT 1 FROM claims c WHERE c.message_id = m.message_id AND c.state = 'consumed' "
            "AND c.fence = m.fence)",
        )
        == []
    )


# -- claim --------------------------------------------------------------------------------


def test_claim_moves_waiting_to_claimed_under_a_new_fence(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)

    outcome = claim(store, mailbox, message_id, holder="run-1", lease=30)

    assert outcome.status is Status.CLAIMED
    assert outcome.fence == fence_counter(db)
    assert outcome.fence is not None
    assert outcome.fence > mailbox.fence
    assert (outcome.holder, outcome.lease_until) == ("run-1", clock.now + 30)
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.fence, row.holder, row.lease_until, row.claimed_at) == (
        "claimed",
        outcome.fence,
        "run-1",
        clock.now + 30,
        clock.now,
    )
    assert rows(db, "SELECT fence, message_id, holder, state FROM claims") == [
        (outcome.fence, message_id, "run-1", "claimed")
    ]


def test_fences_come_from_one_store_wide_counter(store: Store, clock: Clock) -> None:
    fences: list[int] = []
    first = reserve(store, run_id="a")
    fences.append(first.fence)
    for round_ in range(4):
        other = reserve(store, run_id=f"b{round_}")
        fences.append(other.fence)
        for mailbox in (first, other):
            outcome = claim(store, mailbox, deliver(store, mailbox), holder=mailbox.run_id, lease=5)
            assert outcome.fence is not None
            fences.append(outcome.fence)
        clock.advance(1)

    assert fences == sorted(set(fences))


def test_a_second_claim_gets_the_existing_claim(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    first = claim(store, mailbox, message_id, holder="run-1")
    before = snapshot(db)

    same_holder = claim(store, mailbox, message_id, holder="run-1")
    other_holder = claim(store, mailbox, message_id, holder="run-2")

    assert same_holder.status is other_holder.status is Status.ALREADY_CLAIMED
    assert (same_holder.fence, same_holder.holder, same_holder.lease_until) == (
        first.fence,
        "run-1",
        first.lease_until,
    )
    # another holder learns who holds it and until when, never the fence (the proof)
    assert (other_holder.fence, other_holder.holder, other_holder.lease_until) == (
        None,
        "run-1",
        first.lease_until,
    )
    assert snapshot(db) == before  # no fence taken, no claim row, no event


def test_claim_of_a_consumed_message_is_already_consumed(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    first = claim(store, mailbox, message_id)
    assert store.ack(message_id, first.fence or 0).status is Status.CONSUMED
    before = snapshot(db)

    again = claim(store, mailbox, message_id, holder="run-2")
    retried = claim(store, mailbox, message_id, holder="run-1")

    assert again.status is retried.status is Status.ALREADY_CONSUMED
    # The consuming fence goes back to its own holder only: it is that holder's proof.
    assert (again.fence, again.holder) == (None, "run-1")
    assert (retried.fence, retried.holder) == (first.fence, "run-1")
    assert snapshot(db) == before


def test_claim_outside_the_mailbox_is_policy_denied(store: Store, db: Path) -> None:
    mine = reserve(store, run_id="mine")
    theirs = reserve(store, run_id="theirs")
    their_message = deliver(store, theirs)
    [unrouted] = store.deliver(
        mail_from="noreply@app.example.test",
        deliveries=[Delivery(rcpt=f"nobody@{DOMAIN}", alias="nobody", tag=None, domain=DOMAIN)],
        raw=b"Subject: x\r\n\r\nx\r\n",
        subject="x",
        run_header=None,
    )
    before = snapshot(db)

    for message_id in (their_message, unrouted, "m-does-not-exist"):
        assert claim(store, mine, message_id).status is Status.POLICY_DENIED
    assert snapshot(db) == before
    assert claim(store, theirs, their_message).status is Status.CLAIMED


def test_claim_with_a_forged_mailbox_fence_is_refused(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    before = snapshot(db)

    outcome = store.claim(
        mailbox_id=mailbox.mailbox_id,
        mailbox_fence=mailbox.fence + 1,
        message_id=message_id,
        holder="run-1",
        lease=30,
    )

    assert outcome.status is Status.FENCE_MISMATCH
    assert snapshot(db) == before


def test_lease_never_outlives_the_mailbox(store: Store) -> None:
    mailbox = reserve(store, ttl=20)
    message_id = deliver(store, mailbox)

    outcome = claim(store, mailbox, message_id, lease=1000)

    assert outcome.lease_until == mailbox.expires_at


# -- ack ----------------------------------------------------------------------------------


def test_ack_with_the_current_fence_under_a_live_lease_consumes(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=30)
    clock.advance(29)

    acked = store.ack(message_id, claimed.fence or 0)

    assert acked.status is Status.CONSUMED
    assert (acked.fence, acked.holder) == (claimed.fence, "run-1")
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.consumed_at, row.fence) == ("consumed", clock.now, claimed.fence)
    assert rows(db, "SELECT state, ended_at FROM claims") == [("consumed", clock.now)]
    box = store.mailbox(mailbox.mailbox_id)
    assert box is not None
    assert box.state == "consumed"


def test_a_stale_fence_after_reclaim_is_refused_and_changes_nothing(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    old = claim(store, mailbox, message_id, holder="slow", lease=10)
    clock.advance(10.5)
    new = claim(store, mailbox, message_id, holder="fresh", lease=30)
    assert new.status is Status.CLAIMED
    assert old.fence is not None
    assert new.fence is not None
    assert new.fence > old.fence
    assert rows(db, "SELECT fence, holder, state FROM claims ORDER BY fence") == [
        (old.fence, "slow", "expired"),
        (new.fence, "fresh", "claimed"),
    ]
    before = snapshot(db)

    late = [
        store.ack(message_id, old.fence),
        store.renew(message_id, old.fence, 30),
        store.release_claim(message_id, old.fence),
    ]

    assert [o.status for o in late] == [Status.FENCE_MISMATCH] * 3
    # the answer names the fence presented: the current fence is the new holder's proof
    assert {o.fence for o in late} == {old.fence}
    assert snapshot(db) == before
    # The new holder is unaffected and consumes exactly once.
    assert store.ack(message_id, new.fence).status is Status.CONSUMED
    # Once consumed, the new holder retrying is told it is done; the old one stays stale,
    # and neither answer gives the other's fence away.
    retried, late = store.ack(message_id, new.fence), store.ack(message_id, old.fence)
    assert (retried.status, retried.fence) == (Status.ALREADY_CONSUMED, new.fence)
    assert (late.status, late.fence, late.holder) == (Status.FENCE_MISMATCH, old.fence, None)
    assert_consumed_at_most_once(db)


def test_ack_after_the_lease_expired_is_lease_expired(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=10)
    clock.now = (claimed.lease_until or 0) + 0.001

    outcome = store.ack(message_id, claimed.fence or 0)

    assert outcome.status is Status.LEASE_EXPIRED
    assert outcome.fence == claimed.fence
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.consumed_at, row.lease_until) == ("waiting", None, None)
    assert rows(db, "SELECT state FROM claims") == [("expired",)]
    # Asking again still says lease_expired (not consumed, not a different answer).
    assert store.ack(message_id, claimed.fence or 0).status is Status.LEASE_EXPIRED
    assert rows(db, "SELECT COUNT(*) FROM claims WHERE state = 'consumed'") == [(0,)]


@pytest.mark.parametrize(
    "noticed_by",
    ["reclaim", "ack", "renew", "release_claim", "reconcile", "release", "mailbox_expiry"],
)
def test_a_lapsed_lease_is_in_the_timeline_whoever_notices_it(
    store: Store, clock: Clock, db: Path, noticed_by: str
) -> None:
    # The receipt tells why a message was claimed twice: the first lease ran out. That
    # line must not depend on the reconciler passing before the next claim or late ack.
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    first = claim(store, mailbox, message_id, holder="slow", lease=10)
    assert first.fence is not None
    clock.advance(10.5)

    {
        "reclaim": lambda: claim(store, mailbox, message_id, holder="fresh"),
        "ack": lambda: store.ack(message_id, first.fence or 0),
        "renew": lambda: store.renew(message_id, first.fence or 0, 30),
        "release_claim": lambda: store.release_claim(message_id, first.fence or 0),
        "reconcile": store.reconcile,
        "release": lambda: store.release(
            mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_SUCCESS
        ),
        "mailbox_expiry": lambda: (clock.advance(600), store.reconcile()),
    }[noticed_by]()
    store.reconcile()  # and a later pass does not write it twice

    lapsed = rows(
        db,
        "SELECT detail FROM events WHERE mailbox_id = ? AND status = 'lease_expired'",
        (mailbox.mailbox_id,),
    )
    assert lapsed == [(f"{message_id} fence {first.fence}",)]
    assert rows(db, "SELECT state FROM claims WHERE fence = ?", (first.fence,)) == [("expired",)]


def test_a_mailbox_that_consumed_a_message_stays_consumed_through_a_second_claim(
    store: Store, db: Path
) -> None:
    # States only move forward: a second message claimed does not undo the first ack.
    mailbox = reserve(store)
    first_id, second_id = deliver(store, mailbox), deliver(store, mailbox, "Welcome")
    first = claim(store, mailbox, first_id)
    assert store.ack(first_id, first.fence or 0).status is Status.CONSUMED

    assert claim(store, mailbox, second_id).status is Status.CLAIMED

    row = store.mailbox(mailbox.mailbox_id)
    assert row is not None
    assert row.state == "consumed"


@pytest.mark.parametrize("forged", [10**9, 0, -1])
def test_a_forged_fence_is_refused_and_changes_nothing(store: Store, db: Path, forged: int) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id)
    before = snapshot(db)

    outcomes = [
        store.ack(message_id, forged),
        store.renew(message_id, forged, 30),
        store.release_claim(message_id, forged),
    ]

    assert [o.status for o in outcomes] == [Status.FENCE_MISMATCH] * 3
    assert snapshot(db) == before
    assert store.ack(message_id, claimed.fence or 0).status is Status.CONSUMED


def test_ack_of_a_waiting_or_unknown_message_is_refused(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    before = snapshot(db)

    assert store.ack(message_id, mailbox.fence).status is Status.FENCE_MISMATCH
    assert store.ack("m-does-not-exist", 1).status is Status.POLICY_DENIED
    assert snapshot(db) == before


def test_ack_twice_is_already_consumed(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id)
    assert store.ack(message_id, claimed.fence or 0).status is Status.CONSUMED
    before = snapshot(db)
    clock.advance(1)

    again = store.ack(message_id, claimed.fence or 0)

    assert again.status is Status.ALREADY_CONSUMED
    assert (again.fence, again.holder) == (claimed.fence, "run-1")
    assert snapshot(db) == before  # consumed_at is the first ack's time


def test_ack_after_the_mailbox_was_released_is_refused(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=60)
    store.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_ERROR)
    before = snapshot(db)

    outcome = store.ack(message_id, claimed.fence or 0)

    assert outcome.status is Status.RELEASED
    assert outcome.detail == "released_error"
    assert snapshot(db) == before
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.consumed_at) == ("waiting", None)


def test_ack_after_the_mailbox_expired_is_refused(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store, ttl=20)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=60)
    clock.advance(20)

    outcome = store.ack(message_id, claimed.fence or 0)

    assert outcome.status is Status.EXPIRED
    assert outcome.detail == "expired_timeout"
    assert rows(db, "SELECT state FROM claims") == [("expired",)]
    assert rows(db, "SELECT state, consumed_at FROM messages") == [("waiting", None)]


# -- renew --------------------------------------------------------------------------------


def test_renew_extends_the_lease_under_the_same_fence(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=10)
    counter = fence_counter(db)
    clock.advance(8)

    renewed = store.renew(message_id, claimed.fence or 0, 10)

    assert renewed.status is Status.CLAIMED
    assert renewed.fence == claimed.fence
    assert renewed.lease_until == clock.now + 10
    assert fence_counter(db) == counter  # a renewal takes no new fence
    assert rows(db, "SELECT lease_until FROM claims") == [(clock.now + 10,)]
    row = store.message(message_id)
    assert row is not None
    assert row.lease_until == clock.now + 10

    clock.advance(5)  # past the original lease, inside the renewed one
    assert claim(store, mailbox, message_id, holder="run-2").status is Status.ALREADY_CLAIMED
    assert store.ack(message_id, claimed.fence or 0).status is Status.CONSUMED


@pytest.fixture
def count_scans(monkeypatch: pytest.MonkeyPatch) -> Callable[[], list[int]]:
    """Counts, from the call on, each look a wait takes at the store (``Mailbox._scan``):
    one entry a look, in the list it returns."""

    def start() -> list[int]:
        looks: list[int] = []
        scan = Mailbox._scan

        def counted(self: Mailbox, *args: Any, **kwargs: Any) -> Any:
            looks.append(1)
            return scan(self, *args, **kwargs)

        monkeypatch.setattr(Mailbox, "_scan", counted)
        return looks

    return start


def test_a_wait_looks_again_once_per_lease_whatever_the_store_clock_does(
    store: Store, clock: Clock, count_scans: Callable[[], list[int]]
) -> None:
    """A wait wakes when a lease in its way ends, reckoned on the store's clock. One that
    stands still (a test's fake clock) never lets it end: the wait looked again every
    millisecond, about 1,700 scans in two seconds, until its deadline."""
    box = Mailbox.reserve(store, contract=EmailContract(purpose="verify"), domain=DOMAIN)
    deliver(store, box)  # type: ignore[arg-type]  # a Mailbox has the address fields
    held = box.wait_for(subject="Verify", timeout=0, lease=30)
    clock.advance(30 - 0.001)  # a millisecond of the lease left, on a clock that stands still
    with pytest.raises(WaitTimeout):  # its waiting step is recorded: the next records none
        box.wait_for(subject="Verify", timeout=0)
    scans = count_scans()
    with pytest.raises(WaitTimeout, match="already claimed by this run"):
        box.wait_for(subject="Verify", timeout=0.5)
    # The first look, once when the lease should have ended, the last; only two if this
    # machine stalled past the deadline before the wake-up: never one scan per millisecond.
    assert 2 <= len(scans) <= 3
    held.ack()


def test_renew_never_outlives_the_mailbox(store: Store) -> None:
    mailbox = reserve(store, ttl=50)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=10)

    renewed = store.renew(message_id, claimed.fence or 0, 1000)

    assert renewed.lease_until == mailbox.expires_at


@pytest.mark.parametrize("lease", [0.05, -100])
def test_renew_never_shortens_a_lease(store: Store, clock: Clock, lease: float) -> None:
    """contract.md: a renewal gives a later lease_until; a short one is no renewal."""
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=60)
    clock.advance(1)

    renewed = store.renew(message_id, claimed.fence or 0, lease)

    assert (renewed.status, renewed.lease_until) == (Status.CLAIMED, claimed.lease_until)
    clock.advance(30)  # past what the short renewal would have left
    assert store.ack(message_id, claimed.fence or 0).status is Status.CONSUMED


def test_renew_after_expiry_is_lease_expired(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id, lease=10)
    clock.advance(10)

    renewed = store.renew(message_id, claimed.fence or 0, 30)

    assert renewed.status is Status.LEASE_EXPIRED
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.lease_until) == ("waiting", None)
    # The lost lease does not come back: someone else may take the message now.
    taken = claim(store, mailbox, message_id, holder="run-2")
    assert taken.status is Status.CLAIMED
    assert (taken.fence or 0) > (claimed.fence or 0)


# -- release_claim ------------------------------------------------------------------------


def test_release_claim_gives_the_message_back(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    first = claim(store, mailbox, message_id, holder="run-1", lease=30)
    clock.advance(1)

    released = store.release_claim(message_id, first.fence or 0)

    assert released.status is Status.WAITING
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.lease_until) == ("waiting", None)
    assert rows(db, "SELECT fence, state, ended_at FROM claims") == [
        (first.fence, "released", clock.now)
    ]

    second = claim(store, mailbox, message_id, holder="run-2", lease=30)
    assert second.status is Status.CLAIMED
    assert (second.fence or 0) > (first.fence or 0)
    before = snapshot(db)
    assert store.ack(message_id, first.fence or 0).status is Status.FENCE_MISMATCH
    assert store.release_claim(message_id, first.fence or 0).status is Status.FENCE_MISMATCH
    assert snapshot(db) == before
    assert store.ack(message_id, second.fence or 0).status is Status.CONSUMED
    assert_consumed_at_most_once(db)


def test_ack_with_a_released_fence_is_refused_before_any_reclaim(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    first = claim(store, mailbox, message_id)
    store.release_claim(message_id, first.fence or 0)
    before = snapshot(db)

    outcome = store.ack(message_id, first.fence or 0)

    assert outcome.status is Status.FENCE_MISMATCH
    assert snapshot(db) == before
    row = store.message(message_id)
    assert row is not None
    assert row.state == "waiting"


# -- real processes -----------------------------------------------------------------------

CTX = multiprocessing.get_context("spawn")


def _racer(
    path: str,
    jobs: list[tuple[str, int, str]],
    holder: str,
    barrier: Barrier,
    results: Any,
) -> None:
    """One contender: per round, claim together, then ack together with the fence it saw."""
    store = Store(path)
    try:
        for round_, (mailbox_id, mailbox_fence, message_id) in enumerate(jobs):
            barrier.wait(HANG)
            claimed = store.claim(
                mailbox_id=mailbox_id,
                mailbox_fence=mailbox_fence,
                message_id=message_id,
                holder=holder,
                lease=HANG,
            )
            barrier.wait(HANG)  # nobody acks before everybody claimed
            acked = store.ack(message_id, claimed.fence or 0)
            results.put(
                (
                    round_,
                    holder,
                    claimed.status.value,
                    claimed.fence,
                    claimed.holder,
                    acked.status.value,
                )
            )
    finally:
        store.close()


def test_exactly_one_of_several_processes_wins_each_claim(db: Path) -> None:
    contenders, rounds = 6, 20
    store = Store(db)
    try:
        mailbox, _ = store.reserve(run_id="race", purpose="race", ttl=3600, domain=DOMAIN)
        jobs = [
            (mailbox.mailbox_id, mailbox.fence, deliver(store, mailbox, f"round {i}"))
            for i in range(rounds)
        ]
        barrier = CTX.Barrier(contenders)
        results = CTX.Queue()
        procs = [
            CTX.Process(target=_racer, args=(str(db), jobs, f"holder-{i}", barrier, results))
            for i in range(contenders)
        ]
        for proc in procs:
            proc.start()
        try:
            got = [results.get(timeout=HANG) for _ in range(contenders * rounds)]
        finally:
            for proc in procs:
                proc.join(HANG)
                if proc.is_alive():  # pragma: no cover - only when the test already failed
                    proc.kill()
                    proc.join()
        assert [proc.exitcode for proc in procs] == [0] * contenders

        winner_fences: list[int] = []
        for round_ in range(rounds):
            mine = [r for r in got if r[0] == round_]
            winners = [r for r in mine if r[2] == Status.CLAIMED.value]
            losers = [r for r in mine if r[2] != Status.CLAIMED.value]
            assert len(winners) == 1, mine
            [(_, winner, _, fence, _, _)] = winners
            assert [r[2] for r in losers] == [Status.ALREADY_CLAIMED.value] * (contenders - 1)
            # every loser was told who holds it, but never the holder's fence
            assert {(r[3], r[4]) for r in losers} == {(None, winner)}
            # everyone acked at once: only the winner's fence consumes
            assert [r[5] for r in winners] == [Status.CONSUMED.value]
            assert {r[5] for r in losers} <= {
                Status.ALREADY_CONSUMED.value,
                Status.FENCE_MISMATCH.value,
            }
            winner_fences.append(fence)
            message_id = jobs[round_][2]
            assert rows(
                db, "SELECT holder, fence, state FROM messages WHERE message_id = ?", (message_id,)
            ) == [(winner, fence, "consumed")]

        assert all(a < b for a, b in itertools.pairwise(winner_fences))
        assert rows(db, "SELECT COUNT(*) FROM claims") == [(rounds,)]
        assert rows(db, "SELECT COUNT(*) FROM messages WHERE state = 'consumed'") == [(rounds,)]
        assert_consumed_at_most_once(db)
    finally:
        store.close()


def _slow_holder(
    path: str,
    mailbox_id: str,
    mailbox_fence: int,
    message_id: str,
    lease: float,
    go: Event,
    reports: Any,
) -> None:
    """Claim under a short lease, report it, then (once let go) ack with that fence."""
    store = Store(path)
    try:
        claimed = store.claim(
            mailbox_id=mailbox_id,
            mailbox_fence=mailbox_fence,
            message_id=message_id,
            holder="slow",
            lease=lease,
        )
        reports.put((claimed.status.value, claimed.fence))
        go.wait(HANG)
        acked = store.ack(message_id, claimed.fence or 0)
        reports.put((acked.status.value, acked.fence))
    finally:
        store.close()


def test_a_paused_holder_wakes_up_to_a_refused_ack(db: Path) -> None:
    store = Store(db)  # the real clock: the lease runs out while the holder is stopped
    try:
        mailbox, _ = store.reserve(run_id="pause", purpose="pause", ttl=3600, domain=DOMAIN)
        message_id = deliver(store, mailbox)
        go = CTX.Event()
        reports = CTX.Queue()
        proc = CTX.Process(
            target=_slow_holder,
            args=(str(db), mailbox.mailbox_id, mailbox.fence, message_id, 0.5, go, reports),
        )
        proc.start()
        assert proc.pid is not None
        stopped = False
        try:
            status, old_fence = reports.get(timeout=HANG)
            assert status == Status.CLAIMED.value
            os.kill(proc.pid, signal.SIGSTOP)
            stopped = True

            # Take over: the only way through is the holder's lease running out.
            give_up = time.monotonic() + HANG
            while True:
                taken = claim(store, mailbox, message_id, holder="fresh", lease=HANG)
                if taken.status is Status.CLAIMED:
                    break
                assert taken.status is Status.ALREADY_CLAIMED
                assert (taken.fence, taken.holder) == (None, "slow")  # no fence for others
                assert time.monotonic() < give_up, "the slow holder's lease never ran out"
            assert taken.fence is not None
            assert taken.fence > old_fence
            before = snapshot(db)

            # Wake it before letting it go: it may have been stopped holding the Event's
            # lock, so ``go.set()`` on a stopped holder could block forever.
            os.kill(proc.pid, signal.SIGCONT)
            stopped = False
            go.set()
            late_status, current = reports.get(timeout=HANG)

            assert late_status == Status.FENCE_MISMATCH.value
            assert current == old_fence  # the answer names the fence presented, no other
            assert snapshot(db) == before  # the late ack changed nothing
        finally:
            if stopped:
                os.kill(proc.pid, signal.SIGCONT)
            go.set()
            proc.join(HANG)
            if proc.is_alive():  # pragma: no cover - only when the test already failed
                proc.kill()
                proc.join()
        assert proc.exitcode == 0

        assert store.ack(message_id, taken.fence).status is Status.CONSUMED
        assert rows(db, "SELECT fence, holder, state FROM claims ORDER BY fence") == [
            (old_fence, "slow", "expired"),
            (taken.fence, "fresh", "consumed"),
        ]
        assert rows(db, "SELECT holder, fence, state FROM messages") == [
            ("fresh", taken.fence, "consumed")
        ]
        assert_consumed_at_most_once(db)
    finally:
        store.close()


def _reconciler(path: str, now: float, barrier: Barrier, results: Any) -> None:
    store = Store(path, clock=Clock(now))
    try:
        barrier.wait(HANG)
        results.put(store.reconcile())
    finally:
        store.close()


def test_concurrent_reconcile_expires_each_thing_once(db: Path, clock: Clock) -> None:
    contenders = 4
    store = Store(db, clock=clock)
    try:
        overdue = [reserve(store, run_id=f"overdue-{i}", ttl=10) for i in range(5)]
        lasting = [reserve(store, run_id=f"lasting-{i}", ttl=600) for i in range(3)]
        for mailbox in overdue + lasting:
            claim(store, mailbox, deliver(store, mailbox), holder=mailbox.run_id, lease=20)
        barrier = CTX.Barrier(contenders)
        results = CTX.Queue()
        procs = [
            CTX.Process(target=_reconciler, args=(str(db), clock.now + 30, barrier, results))
            for _ in range(contenders)
        ]
        for proc in procs:
            proc.start()
        try:
            got = [results.get(timeout=HANG) for _ in range(contenders)]
        finally:
            for proc in procs:
                proc.join(HANG)
                if proc.is_alive():  # pragma: no cover - only when the test already failed
                    proc.kill()
                    proc.join()
        assert [proc.exitcode for proc in procs] == [0] * contenders

        assert sum(r["mailboxes"] for r in got) == len(overdue)
        assert sum(r["leases"] for r in got) == len(lasting)
        assert rows(db, "SELECT state, COUNT(*) FROM mailboxes GROUP BY state ORDER BY state") == [
            ("claimed", len(lasting)),
            ("expired", len(overdue)),
        ]
        assert rows(db, "SELECT state, COUNT(*) FROM claims GROUP BY state") == [
            ("expired", len(overdue) + len(lasting))
        ]
        # one expiry event per mailbox, not one per reconciler
        assert rows(db, "SELECT COUNT(*) FROM events WHERE status = 'expired'") == [(len(overdue),)]
    finally:
        store.close()


def test_a_wait_wakes_for_no_lease_on_a_message_it_would_not_take(
    store: Store, clock: Clock, count_scans: Callable[[], list[int]]
) -> None:
    """A lease that ends makes its message a candidate again, so a wait looks again then:
    for a message it would take only. Another message's lease ending is no news to it."""
    box = Mailbox.reserve(store, contract=EmailContract(purpose="verify"), domain=DOMAIN)
    deliver(store, box)  # type: ignore[arg-type]  # a Mailbox has the address fields
    held = box.wait_for(subject="Verify", timeout=0, lease=30)
    clock.advance(30 - 0.001)  # the Verify lease ends a millisecond from now
    with pytest.raises(WaitTimeout):  # its waiting step is recorded: the next records none
        box.wait_for(subject="Reset", timeout=0)
    scans = count_scans()
    with pytest.raises(WaitTimeout):
        box.wait_for(subject="Reset", timeout=0.5)
    # The first look and the last (one only if this machine stalled past the deadline
    # before the first pause): no look when the Verify lease ends, a message it never takes.
    assert len(scans) <= 2
    held.ack()
