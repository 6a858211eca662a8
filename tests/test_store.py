"""The store's reservation side: idempotent reserve, release, reconciliation, and the
``Mailbox`` object on top of it.

Every test uses a real SQLite file in ``tmp_path`` and a controllable clock, so expiry
is reached by moving the clock, never by sleeping.
"""

from __future__ import annotations

import _thread
import hashlib
import os
import sqlite3
import threading
import warnings
from contextlib import closing
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest
from storekit import DOMAIN, T0, Clock, claim, fence_counter, rows, snapshot

from pytest_mailbox import store as store_module
from pytest_mailbox.agent import _Journal, journal_path
from pytest_mailbox.contract import CloseReason, EmailContract, Status, utc
from pytest_mailbox.errors import (
    AlreadyClaimed,
    AlreadyConsumed,
    ContractError,
    LeaseExpired,
    MailboxClosed,
    StoreError,
    WaitTimeout,
)
from pytest_mailbox.mailbox import ClaimedMessage, Mailbox
from pytest_mailbox.store import (
    _EARLIER_RUNS_MAIL,
    _OPEN,
    _REFUSED_COUNT,
    SWEEP_EVERY,
    Delivery,
    MailboxRow,
    MessageRow,
    Store,
)


def reserve(
    store: Store, run_id: str = "run-1", purpose: str = "verify", ttl: float = 100
) -> MailboxRow:
    row, _ = store.reserve(run_id=run_id, purpose=purpose, ttl=ttl, domain=DOMAIN, owner="t::x")
    return row


def raw_message(to: str, subject: str = "Verify your account") -> bytes:
    msg = EmailMessage()
    msg["From"] = "App <noreply@app.example.test>"
    msg["To"] = to
    msg["Subject"] = subject
    msg.set_content("Open https://app.example.test/verify/8f3a9c77d1e24b6a to go on.")
    return msg.as_bytes()


def deliver(
    store: Store, mailbox: MailboxRow | Mailbox, subject: str = "Verify your account"
) -> str:
    """Put one message in ``mailbox`` the way the sink does; its message id."""
    [message_id] = store.deliver(
        mail_from="noreply@app.example.test",
        deliveries=[
            Delivery(rcpt=mailbox.address, alias=mailbox.alias, tag=None, domain=mailbox.domain)
        ],
        raw=raw_message(mailbox.address, subject),
        subject=subject,
        run_header=None,
    )
    return message_id


# -- arguments ----------------------------------------------------------------------------

#: What ``Store`` allows, by argument, and values it refuses.
STORE_ALLOWS = {
    "busy_timeout": ("seconds 0..86400", (float("nan"), "x", -1, 86401, True)),
    "wal_limit": ("a positive number of bytes", ("x", 0, -1, 1.5)),
}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param(name, value, id=f"{name}={value!r}")
        for name, (_, values) in STORE_ALLOWS.items()
        for value in values
    ],
)
def test_store_refuses_a_bad_argument_naming_it_and_what_it_allows(
    tmp_path: Path, name: str, value: object
) -> None:
    # nan and 'x' failed in int() without the argument's name; -1 and 'x' were taken.
    with pytest.raises(ValueError, match="is invalid") as refused:
        Store(tmp_path / "store.sqlite3", **{name: value})  # type: ignore[arg-type]

    assert str(refused.value) == f"{name}={value!r} is invalid; allowed: {STORE_ALLOWS[name][0]}"
    assert list(tmp_path.iterdir()) == []


def test_a_link_loop_is_a_store_error_naming_the_store(tmp_path: Path) -> None:
    # Resolving it raised RuntimeError ("Symlink loop") before Python 3.13.
    (tmp_path / "a.sqlite3").symlink_to(tmp_path / "b.sqlite3")
    (tmp_path / "b.sqlite3").symlink_to(tmp_path / "a.sqlite3")

    with pytest.raises(StoreError, match="no store was opened") as failed:
        Store(tmp_path / "a.sqlite3")

    assert str(failed.value).startswith(f"the store {tmp_path / 'a.sqlite3'} failed: ")


@pytest.mark.parametrize("kind", ["directory", "pipe"])
def test_store_refuses_a_path_that_is_no_regular_file(tmp_path: Path, kind: str) -> None:
    # SQLite said "unable to open database file" or "disk I/O error", not which path; the
    # lock file went beside it (/dev/null.lock).
    path = tmp_path / kind
    if kind == "directory":
        path.mkdir()
    else:
        os.mkfifo(path)

    with pytest.raises(ValueError, match="is invalid") as refused:
        Store(path)

    assert str(refused.value) == (
        f"path={str(path)!r} is invalid; allowed: a path to a regular file, new or a store "
        "(not a directory, device or pipe)"
    )
    assert list(tmp_path.iterdir()) == [path]


# -- reserve ------------------------------------------------------------------------------


def test_a_new_store_file_its_log_and_the_agents_journal_are_its_owner_s_alone(
    tmp_path: Path,
) -> None:
    # It holds every body in clear and the digests' key: 0644 under the usual umask let
    # any user of the machine read them (where --basetemp is not pytest's private folder).
    before = os.umask(0o022)
    try:
        with Store(tmp_path / "new.sqlite3") as store:
            store.reserve(run_id="run-1", purpose="signup", ttl=60, domain=DOMAIN)
            _Journal(journal_path(store.path))  # the agents' evidence, beside it
            modes = {
                name: (tmp_path / name).stat().st_mode & 0o777
                for name in ("new.sqlite3", "new.sqlite3-wal", "new.sqlite3-shm")
            }
            modes["new.agent.sqlite3"] = (tmp_path / "new.agent.sqlite3").stat().st_mode & 0o777
        # a file that was there keeps its mode: the user chose it
        (tmp_path / "old.sqlite3").touch(mode=0o640)
        Store(tmp_path / "old.sqlite3").close()
        # a link to no file yet: SQLite would make its target with the umask's mode
        (tmp_path / "link.sqlite3").symlink_to(tmp_path / "target.sqlite3")
        Store(tmp_path / "link.sqlite3").close()
    finally:
        os.umask(before)

    assert modes == dict.fromkeys(modes, 0o600)
    assert (tmp_path / "target.sqlite3").stat().st_mode & 0o777 == 0o600
    assert (tmp_path / "old.sqlite3").stat().st_mode & 0o777 == 0o640


def test_reserve_is_idempotent_on_run_and_purpose_while_active(store: Store, db: Path) -> None:
    first, created = store.reserve(run_id="run-1", purpose="verify", ttl=100, domain=DOMAIN)
    again, created_again = store.reserve(run_id="run-1", purpose="verify", ttl=100, domain=DOMAIN)

    assert created is True
    assert created_again is False
    assert (again.mailbox_id, again.alias, again.address, again.fence) == (
        first.mailbox_id,
        first.alias,
        first.address,
        first.fence,
    )
    assert rows(db, "SELECT COUNT(*) FROM mailboxes") == [(1,)]
    # A retried reserve takes no fence: the counter moved once, for the one mailbox.
    assert fence_counter(db) == first.fence


def test_reserve_is_idempotent_after_the_mailbox_was_used(store: Store, clock: Clock) -> None:
    first = reserve(store)
    message_id = deliver(store, first)
    outcome = claim(store, first, message_id)
    assert store.ack(message_id, outcome.fence).status is Status.CONSUMED
    clock.advance(10)

    again, created = store.reserve(run_id="run-1", purpose="verify", ttl=100, domain=DOMAIN)

    assert created is False
    assert (again.mailbox_id, again.fence) == (first.mailbox_id, first.fence)
    assert again.state == Status.CONSUMED.value


def test_reserve_with_another_purpose_or_run_gets_another_mailbox(store: Store) -> None:
    first = reserve(store, run_id="run-1", purpose="verify")
    other_purpose = reserve(store, run_id="run-1", purpose="reset")
    other_run = reserve(store, run_id="run-2", purpose="verify")

    assert len({first.mailbox_id, other_purpose.mailbox_id, other_run.mailbox_id}) == 3
    assert len({first.address, other_purpose.address, other_run.address}) == 3
    assert first.fence < other_purpose.fence < other_run.fence


def test_reserve_after_expiry_gets_a_new_mailbox_with_a_higher_fence(
    store: Store, clock: Clock, db: Path
) -> None:
    old = reserve(store, ttl=100)
    old_message = deliver(store, old)
    clock.advance(100.5)

    new, created = store.reserve(run_id="run-1", purpose="verify", ttl=100, domain=DOMAIN)

    assert created is True
    assert new.mailbox_id != old.mailbox_id
    assert new.address != old.address
    assert new.fence > old.fence
    assert new.expires_at == clock.now + 100
    expired = store.mailbox(old.mailbox_id)
    assert expired is not None
    assert (expired.state, expired.close_reason, expired.closed_at) == (
        Status.EXPIRED.value,
        CloseReason.EXPIRED_TIMEOUT.value,
        clock.now,
    )

    # The old handle is dead: its own mailbox refuses with `expired` ...
    assert claim(store, old, old_message).status is Status.EXPIRED
    assert store.release(old.mailbox_id, old.fence, CloseReason.RELEASED_SUCCESS).status is (
        Status.EXPIRED
    )
    # ... its fence does not open the new mailbox ...
    stale = store.claim(
        mailbox_id=new.mailbox_id,
        mailbox_fence=old.fence,
        message_id=old_message,
        holder="run-1",
        lease=30,
    )
    assert stale.status is Status.FENCE_MISMATCH
    assert stale.fence == old.fence  # the fence presented; the current one is never told
    # ... and the new mailbox cannot take the old address's mail.
    assert claim(store, new, old_message).status is Status.POLICY_DENIED
    assert rows(db, "SELECT COUNT(*) FROM claims") == [(0,)]


def test_reserve_at_the_exact_expiry_instant_is_a_new_mailbox(store: Store, clock: Clock) -> None:
    old = reserve(store, ttl=100)
    clock.now = old.expires_at

    new = reserve(store, ttl=100)

    assert new.mailbox_id != old.mailbox_id
    assert new.fence > old.fence


# -- release ------------------------------------------------------------------------------


def test_release_ends_live_claims_and_refuses_every_later_operation(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve(store)
    held = deliver(store, mailbox, "held")
    done = deliver(store, mailbox, "done")
    waiting = deliver(store, mailbox, "waiting")
    held_claim = claim(store, mailbox, held, lease=60)
    done_claim = claim(store, mailbox, done, lease=60)
    assert store.ack(done, done_claim.fence).status is Status.CONSUMED
    clock.advance(1)

    released = store.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_SUCCESS)

    assert released.status is Status.RELEASED
    row = store.mailbox(mailbox.mailbox_id)
    assert row is not None
    assert (row.state, row.close_reason, row.closed_at) == (
        "released",
        "released_success",
        clock.now,
    )
    # The live claim ended with the mailbox; the consumed one stays consumed.
    assert rows(db, "SELECT fence, state, ended_at FROM claims ORDER BY fence") == [
        (held_claim.fence, "released", clock.now),
        (done_claim.fence, "consumed", clock.now - 1),
    ]
    held_row = store.message(held)
    assert held_row is not None
    assert (held_row.state, held_row.lease_until) == ("waiting", None)

    before = snapshot(db)
    refusals = [
        claim(store, mailbox, waiting),
        claim(store, mailbox, held),
        claim(store, mailbox, done),
        store.ack(held, held_claim.fence),
        store.ack(done, done_claim.fence),
        store.renew(held, held_claim.fence, 30),
        store.release_claim(held, held_claim.fence),
        store.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_ERROR),
    ]
    assert [r.status for r in refusals] == [Status.RELEASED] * len(refusals)
    assert snapshot(db) == before


def test_release_with_a_stale_mailbox_fence_is_refused(store: Store, db: Path) -> None:
    mailbox = reserve(store)
    before = snapshot(db)

    outcome = store.release(mailbox.mailbox_id, mailbox.fence + 1, CloseReason.RELEASED_SUCCESS)

    assert outcome.status is Status.FENCE_MISMATCH
    assert outcome.fence == mailbox.fence + 1  # the fence presented, not the current one
    assert snapshot(db) == before


def test_release_of_an_unknown_mailbox_is_policy_denied(store: Store) -> None:
    outcome = store.release("mbx-nope", 1, CloseReason.RELEASED_SUCCESS)
    assert outcome.status is Status.POLICY_DENIED


@pytest.mark.parametrize("ttl", [100, 10], ids=["open", "overdue"])
def test_release_and_read_returns_the_history_the_release_left(
    store: Store, clock: Clock, ttl: float
) -> None:
    mailbox = reserve(store, ttl=ttl)
    message_id = deliver(store, mailbox)
    clock.advance(20)

    outcome, history = store.release_and_read(
        mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_SUCCESS
    )

    assert history == store.history(mailbox.mailbox_id)
    assert history.mailbox is not None
    assert [m.message_id for m in history.messages] == [message_id]
    # Refused (the mailbox expired first) or not, the history is read after the write.
    expected = Status.RELEASED if ttl == 100 else Status.EXPIRED
    assert outcome.status is expected
    assert history.mailbox.state == expected.value
    assert [e["status"] for e in history.events] == ["reserved", "received", expected.value]


@pytest.mark.parametrize("how", ["released", "expired"])
def test_mark_never_reopens_a_closed_mailbox(
    store: Store, clock: Clock, db: Path, how: str
) -> None:
    mailbox = reserve(store, ttl=100)
    message_id = deliver(store, mailbox)
    if how == "released":
        store.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_ERROR)
    else:
        clock.advance(101)
        assert store.reconcile()["mailboxes"] == 1
    before = snapshot(db)

    refused = store.mark(mailbox.mailbox_id, mailbox.fence, Status.WAITING, "any message")

    assert refused is not None
    assert refused.status.value == how
    assert snapshot(db) == before
    assert claim(store, mailbox, message_id).status.value == how


# -- reconcile ----------------------------------------------------------------------------


def test_reconcile_expires_overdue_mailboxes_and_leases_only(
    store: Store, clock: Clock, db: Path
) -> None:
    short = reserve(store, run_id="short", ttl=10)
    lapsing = reserve(store, run_id="lapsing", ttl=100)
    live = reserve(store, run_id="live", ttl=100)
    idle = reserve(store, run_id="idle", ttl=100)
    in_short = deliver(store, short)
    in_lapsing = deliver(store, lapsing)
    in_live = deliver(store, live)
    short_claim = claim(store, short, in_short, holder="short", lease=60)
    lapsing_claim = claim(store, lapsing, in_lapsing, holder="lapsing", lease=5)
    live_claim = claim(store, live, in_live, holder="live", lease=50)
    assert short_claim.lease_until == short.expires_at  # a lease never outlives its mailbox
    clock.advance(11)

    counts = store.reconcile()

    assert counts == {"mailboxes": 1, "leases": 1}
    by_id = {r[0]: r[1:] for r in rows(db, "SELECT mailbox_id, state, close_reason FROM mailboxes")}
    assert by_id == {
        short.mailbox_id: ("expired", "expired_timeout"),
        lapsing.mailbox_id: ("claimed", None),
        live.mailbox_id: ("claimed", None),
        idle.mailbox_id: ("reserved", None),
    }
    assert rows(db, "SELECT fence, state FROM claims ORDER BY fence") == [
        (short_claim.fence, "expired"),
        (lapsing_claim.fence, "expired"),
        (live_claim.fence, "claimed"),
    ]
    messages = {
        r[0]: r[1:] for r in rows(db, "SELECT message_id, state, lease_until, fence FROM messages")
    }
    assert messages == {
        in_short: ("waiting", None, short_claim.fence),
        in_lapsing: ("waiting", None, lapsing_claim.fence),
        in_live: ("claimed", live_claim.lease_until, live_claim.fence),
    }
    statuses = [e["status"] for e in store.events(lapsing.mailbox_id)]
    assert statuses[-1] == Status.LEASE_EXPIRED.value

    # Idempotent: nothing is left to do, and nothing is written.
    before = snapshot(db)
    assert store.reconcile() == {"mailboxes": 0, "leases": 0}
    assert snapshot(db) == before

    # The reconciled lease can be claimed again, under a higher fence.
    again = claim(store, lapsing, in_lapsing, holder="lapsing-2")
    assert again.status is Status.CLAIMED
    assert again.fence > live_claim.fence


def test_reconcile_from_another_handle_on_the_same_file(db: Path, clock: Clock) -> None:
    first = Store(db, clock=clock)
    second = Store(db, clock=clock)
    try:
        mailbox = reserve(first, ttl=10)
        clock.advance(10)

        assert second.reconcile() == {"mailboxes": 1, "leases": 0}
        assert first.reconcile() == {"mailboxes": 0, "leases": 0}
        row = first.mailbox(mailbox.mailbox_id)
        assert row is not None
        assert row.state == "expired"
    finally:
        first.close()
        second.close()


def test_reading_an_overdue_mailbox_reconciles_it(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve(store, ttl=10)
    clock.advance(10.5)
    assert rows(db, "SELECT state FROM mailboxes") == [("reserved",)]

    row = store.mailbox(mailbox.mailbox_id)

    assert row is not None
    assert (row.state, row.close_reason, row.closed_at) == ("expired", "expired_timeout", clock.now)
    assert rows(db, "SELECT state FROM mailboxes") == [("expired",)]


def test_a_write_looks_for_other_overdue_mailboxes_once_per_sweep_interval(
    store: Store, clock: Clock, db: Path
) -> None:
    lapsing = reserve(store, run_id="lapsing", ttl=SWEEP_EVERY / 2)  # the handle's first look
    clock.advance(SWEEP_EVERY * 0.75)  # overdue, but the last look was less than a sweep ago

    store.reserve(run_id="other-1", purpose="verify", ttl=100, domain=DOMAIN, fresh=True)

    assert rows(db, "SELECT state FROM mailboxes WHERE mailbox_id = ?", (lapsing.mailbox_id,)) == [
        ("reserved",)
    ]
    clock.advance(SWEEP_EVERY * 0.25)  # a sweep interval since the last look

    store.reserve(run_id="other-2", purpose="verify", ttl=100, domain=DOMAIN, fresh=True)

    assert rows(
        db, "SELECT state, closed_at FROM mailboxes WHERE mailbox_id = ?", (lapsing.mailbox_id,)
    ) == [("expired", clock.now)]


ON_ITS_OWN_MAILBOX = {
    "claim": lambda store, mailbox, held: claim(store, mailbox, deliver(store, mailbox)).status,
    "ack": lambda store, mailbox, held: store.ack(held.message_id, held.fence).status,
    "release": lambda store, mailbox, held: (
        store.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_SUCCESS).status
    ),
    "reserve again": lambda store, mailbox, held: (
        Status.EXPIRED if reserve(store).mailbox_id != mailbox.mailbox_id else Status.RESERVED
    ),
}


@pytest.mark.parametrize("operation", list(ON_ITS_OWN_MAILBOX))
def test_a_write_on_an_overdue_mailbox_expires_it_between_sweeps(
    store: Store, clock: Clock, db: Path, operation: str
) -> None:
    mailbox = reserve(store, ttl=SWEEP_EVERY / 2)  # the handle's first look: next one a sweep on
    held = claim(store, mailbox, deliver(store, mailbox))
    assert held.status is Status.CLAIMED
    clock.advance(SWEEP_EVERY * 0.75)

    status = ON_ITS_OWN_MAILBOX[operation](store, mailbox, held)

    assert status is Status.EXPIRED
    assert rows(
        db,
        "SELECT state, close_reason, closed_at FROM mailboxes WHERE mailbox_id = ?",
        (mailbox.mailbox_id,),
    ) == [("expired", "expired_timeout", clock.now)]


# -- Mailbox ------------------------------------------------------------------------------


CONTRACT = EmailContract(purpose="verification", ttl=120, lease=30, timeout=5)


def reserve_mailbox(store: Store, run_id: str = "r-mailbox") -> Mailbox:
    return Mailbox.reserve(
        store, contract=CONTRACT, domain="Mailbox.Test.", run_id=run_id, nodeid="t::test"
    )


@pytest.mark.parametrize(
    ("contract", "ttl_max", "expected"),
    [
        (
            EmailContract(ttl=7200),
            None,
            "Mailbox.reserve: ttl=7200 exceeds mailbox_ttl_max=3600; lower ttl or pass a larger",
        ),
        (
            EmailContract(ttl=7200),
            600,
            "Mailbox.reserve: ttl=7200 exceeds mailbox_ttl_max=600; lower ttl or pass a larger "
            r"ttl_max= \(the plugin passes mailbox_ttl_max\)$",
        ),
        (
            EmailContract(ttl=10, lease=60),
            None,
            "Mailbox.reserve: lease=60 exceeds ttl=10; a claim cannot outlive its mailbox",
        ),
    ],
)
def test_mailbox_reserve_holds_the_contract_to_its_limits(
    store: Store, db: Path, contract: EmailContract, ttl_max: int | None, expected: str
) -> None:
    # Without the plugin too: a claim never outlives its mailbox, a ttl never the maximum.
    limits = {} if ttl_max is None else {"ttl_max": ttl_max}

    with pytest.raises(ContractError, match=expected):
        Mailbox.reserve(store, contract=contract, domain=DOMAIN, **limits)

    assert rows(db, "SELECT COUNT(*) FROM mailboxes") == [(0,)]
    wide = Mailbox.reserve(store, contract=EmailContract(ttl=7200), domain=DOMAIN, ttl_max=86400)
    row = store.mailbox(wide.mailbox_id)
    assert row is not None
    assert row.expires_at - row.created_at == 7200


#: What ``Mailbox.reserve`` allows: what mailbox_domain and mailbox_ttl_max allow.
RESERVE_ALLOWS = {
    "domain": "a domain name",
    "ttl_max": "an integer 1..86400",
    "contract": "an EmailContract (EmailContract(**fields) builds one from a dict)",
}


@pytest.mark.parametrize(
    ("name", "value"),
    [
        pytest.param(name, value, id=f"{name}={value!r}")
        for name, values in (
            ("domain", ("", "a b", "x@b.test", "https://a.test/", 5, None)),
            ("ttl_max", (0, -1, 86401, 1.5, float("nan"), "x", None, True)),
            ("contract", ({"purpose": "signup"},)),
        )
        for value in values
    ],
)
def test_mailbox_reserve_refuses_a_bad_argument_naming_it_and_what_it_allows(
    store: Store, db: Path, name: str, value: object
) -> None:
    # No address on "a b", no ttl limit silently off, no AttributeError deep inside.
    arguments: dict[str, Any] = {"contract": CONTRACT, "domain": DOMAIN, name: value}

    with pytest.raises(ContractError) as refused:
        Mailbox.reserve(store, **arguments)

    assert str(refused.value) == (
        f"Mailbox.reserve: {name}={value!r} is invalid; allowed: {RESERVE_ALLOWS[name]}"
    )
    assert rows(db, "SELECT COUNT(*) FROM mailboxes") == [(0,)]
    kept = Mailbox.reserve(store, contract=EmailContract(), domain=" Bücher.Test. ", ttl_max=60.0)
    assert (kept.domain, kept.contract.ttl) == ("xn--bcher-kva.test", 60)


def test_a_second_release_is_refused_like_any_call_on_a_closed_mailbox(
    store: Store, db: Path
) -> None:
    mailbox = reserve_mailbox(store)
    assert mailbox.release().status is Status.RELEASED
    before = snapshot(db)

    with pytest.raises(
        MailboxClosed, match=r"released: mailbox .* was released \(released_success\)"
    ) as refused:
        mailbox.release(CloseReason.RELEASED_ERROR)

    assert refused.value.status is Status.RELEASED
    assert snapshot(db) == before  # the first close reason stands


def test_mailbox_reserve_is_idempotent_for_the_same_run(store: Store) -> None:
    first = reserve_mailbox(store)
    again = reserve_mailbox(store)

    assert first.address.endswith("@mailbox.test")
    assert first.address.startswith("verification-")
    assert (again.mailbox_id, again.address, again.fence) == (
        first.mailbox_id,
        first.address,
        first.fence,
    )


def test_mailbox_wait_for_claims_and_close_success_acks(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    clock.advance(1)
    claimed_at = clock.now

    msg = mailbox.wait_for(subject_contains="Verify", timeout=5)

    assert isinstance(msg, ClaimedMessage)
    assert msg.message_id == message_id
    assert msg.fence > mailbox.fence
    assert msg.lease_until == utc(claimed_at + CONTRACT.lease)
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.holder, row.fence) == ("claimed", mailbox.run_id, msg.fence)

    clock.advance(2)
    receipt = mailbox.close(success=True)

    assert (receipt.state, receipt.close_reason) == ("released", "released_success")
    assert receipt.released_at == utc(clock.now)
    [seen] = receipt.messages
    assert (seen.message_id, seen.state, seen.fence) == (message_id, "consumed", msg.fence)
    assert seen.claimed_at == utc(claimed_at)
    assert seen.consumed_at == utc(clock.now)
    assert rows(db, "SELECT fence, state FROM claims") == [(msg.fence, "consumed")]
    assert mailbox.state == "released"


def test_mailbox_close_failure_gives_the_claim_back(store: Store, clock: Clock, db: Path) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    msg = mailbox.wait_for(subject="Verify your account")
    clock.advance(1)

    receipt = mailbox.close(success=False)

    assert (receipt.state, receipt.close_reason) == ("released", "released_error")
    [seen] = receipt.messages
    assert (seen.state, seen.fence, seen.consumed_at) == ("waiting", msg.fence, None)
    assert seen.claimed_at == utc(clock.now - 1)
    assert rows(db, "SELECT fence, state FROM claims") == [(msg.fence, "released")]
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.consumed_at) == ("waiting", None)


def test_mailbox_operations_after_close_raise_mailbox_closed(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    msg = mailbox.wait_for(subject="Verify your account")
    mailbox.close(success=False)

    with pytest.raises(MailboxClosed) as acked:
        msg.ack()
    with pytest.raises(MailboxClosed) as claimed:
        mailbox.claim(message_id)
    with pytest.raises(MailboxClosed) as waited:
        mailbox.wait_for(timeout=0)

    assert {e.value.status for e in (acked, claimed, waited)} == {Status.RELEASED}
    assert acked.value.result["detail"] == "released_error"
    row = store.message(message_id)
    assert row is not None
    assert row.state == "waiting"


def test_mailbox_close_success_does_not_ack_an_expired_lease(
    store: Store, clock: Clock, db: Path
) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    msg = mailbox.wait_for(subject_contains="Verify", lease=5)
    clock.advance(5)

    receipt = mailbox.close(success=True)

    assert receipt.close_reason == "released_success"
    [seen] = receipt.messages
    assert (seen.state, seen.consumed_at) == ("waiting", None)
    assert rows(db, "SELECT COUNT(*) FROM claims WHERE state = 'consumed'") == [(0,)]
    assert store.ack(message_id, msg.fence).status is Status.RELEASED


@pytest.mark.parametrize("success", [True, False])
def test_mailbox_close_after_expiry_keeps_expired_timeout(
    store: Store, clock: Clock, success: bool
) -> None:
    # A failing test's teardown too: the mailbox expired while the test ran.
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    mailbox.wait_for(subject_contains="Verify")
    clock.advance(CONTRACT.ttl)

    receipt = mailbox.close(success=success)

    assert (receipt.state, receipt.close_reason) == ("expired", "expired_timeout")
    [seen] = receipt.messages
    assert (seen.state, seen.consumed_at) == ("waiting", None)


def test_a_failing_tests_close_keeps_its_receipt_when_the_mailbox_expires_meanwhile(
    store: Store, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # close(success=False) checks that the mailbox is open, gives its claims back, then
    # releases it. The ttl runs out in between (a slow machine, a lock wait under xdist).
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    mailbox.wait_for(subject_contains="Verify")
    clock.advance(CONTRACT.ttl - 0.01)
    read_messages = store.messages

    def slow_messages(mailbox_id: str) -> list[MessageRow]:
        clock.advance(0.02)
        return read_messages(mailbox_id)

    monkeypatch.setattr(store, "messages", slow_messages)

    receipt = mailbox.close(success=False)

    assert (receipt.state, receipt.close_reason) == ("expired", "expired_timeout")


def test_a_receipt_of_an_overdue_mailbox_reports_it_expired(store: Store, clock: Clock) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    clock.advance(CONTRACT.ttl)  # no write since: only reading the receipt finds it overdue

    receipt = mailbox.receipt()

    assert (receipt.state, receipt.close_reason) == ("expired", "expired_timeout")
    assert [e.status for e in receipt.events] == ["reserved", "received", "expired"]


class _Cut(Exception):
    """What lands in the middle of a read: pytest-timeout's signal, Ctrl-C."""


def test_a_read_cut_short_leaves_the_threads_reader_on_no_old_snapshot(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = reserve_mailbox(store)
    deliver(store, first)
    deliver(store, first, subject="second")

    def cut(row: sqlite3.Row) -> MessageRow:
        raise _Cut

    monkeypatch.setattr(store_module, "_message", cut)
    with pytest.raises(_Cut) as kept:  # kept alive, as pytest keeps a failure's traceback
        store.messages(first.mailbox_id)
    monkeypatch.undo()

    later = reserve_mailbox(store, run_id="r-later")
    deliver(store, later, subject="for the later test")
    row = store.mailbox(later.mailbox_id)
    assert row is not None
    assert row.active
    assert later.wait_for(timeout=0).subject == "for the later test"
    assert kept.traceback  # still alive here


def test_a_mailbox_gone_from_its_store_says_so_not_that_it_expired(store: Store, db: Path) -> None:
    mailbox = reserve_mailbox(store)
    fresh = db.with_name("fresh.sqlite3")  # another run's store, put in this one's place
    Store(fresh).close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    fresh.rename(db)
    store.close()  # its next reads open the file now at its path

    with pytest.raises(MailboxClosed) as gone:
        mailbox.wait_for(timeout=0)

    assert gone.value.status is Status.POLICY_DENIED
    assert str(gone.value) == (
        f"policy_denied: mailbox {mailbox.address} (test t::test) is not in the store {db}: "
        "the file was removed or replaced while the run used it (two pytest runs with one "
        "--basetemp share it; give each its own)"
    )


def _replaced(store: Store, db: Path) -> None:
    """Put a fresh store (another run's) in ``store``'s place, as a second pytest run given
    the same --basetemp does; ``store``'s next reads open the file now at its path."""
    fresh = db.with_name("fresh.sqlite3")
    Store(fresh).close()
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    fresh.rename(db)
    store.close()


def test_the_state_of_a_mailbox_gone_from_its_store_is_no_expiry(store: Store, db: Path) -> None:
    mailbox = reserve_mailbox(store)
    assert mailbox.state == "reserved"
    _replaced(store, db)

    with pytest.raises(MailboxClosed) as gone:
        mailbox.state  # noqa: B018 - the property is the call

    assert gone.value.status is Status.POLICY_DENIED
    assert str(gone.value).startswith(
        f"policy_denied: mailbox {mailbox.address} (test t::test) is not in the store {db}: "
    )


def test_history_reads_the_mailbox_its_messages_timeline_and_secrets_together(
    store: Store,
) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    mailbox.wait_for(subject="Verify your account").link()  # records the link's digest

    history = store.history(mailbox.mailbox_id)

    assert history.mailbox == store.mailbox(mailbox.mailbox_id)
    assert history.messages == store.messages(mailbox.mailbox_id)
    assert [tuple(e) for e in history.events] == [
        tuple(e) for e in store.events(mailbox.mailbox_id)
    ]
    assert [(s["message_id"], s["kind"]) for s in history.secrets] == [(message_id, "link")]
    assert store.history("mbx-unknown") == (None, [], [], [])


def test_mailbox_reserve_holds_a_ttl_nobody_gave_to_ttl_max(store: Store) -> None:
    mailbox = Mailbox.reserve(store, contract=EmailContract(), domain=DOMAIN, ttl_max=120)

    row = store.mailbox(mailbox.mailbox_id)
    assert row is not None
    assert row.expires_at - row.created_at == 120
    assert (mailbox.contract.ttl, mailbox.contract.lease) == (120, 60)
    with pytest.raises(ContractError, match=r"lease=200 exceeds ttl=120"):
        Mailbox.reserve(store, contract=EmailContract(lease=200), domain=DOMAIN, ttl_max=120)


def test_refusals_after_a_claim_say_why_and_what_to_do(store: Store, clock: Clock) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    claimed = mailbox.wait_for(subject="Verify your account")
    clock.advance(CONTRACT.lease + 0.5)

    with pytest.raises(LeaseExpired) as lapsed:
        claimed.ack()
    mailbox.release()
    with pytest.raises(MailboxClosed) as released:
        claimed.renew()
    overdue = reserve_mailbox(store, run_id="r-overdue")
    clock.advance(CONTRACT.ttl)
    with pytest.raises(MailboxClosed) as expired:
        overdue.wait_for(timeout=0)

    assert claimed.lease_until is not None
    ended = f"{claimed.lease_until:%H:%M:%S.%f}"[:-3]
    assert str(lapsed.value) == (
        f"ack {claimed.message_id}: lease_expired; its lease ended 0.5s ago, at {ended} UTC: "
        "ack or renew() it while the lease lasts, or claim with a longer lease (lease=, "
        "email_contract lease=30)"
    )
    assert str(released.value) == (
        f"renew {claimed.message_id}: released; mailbox {mailbox.address} (test t::test) was "
        "released (released_success), and refuses every call after that: wait for, claim "
        "and ack its mail before release() or close(); a mailbox serves one test, and each "
        "test gets its own isolated_mailbox"
    )
    assert str(expired.value) == (
        f"expired: mailbox {overdue.address} (test t::test) outlived its ttl of 120s "
        f"(email_contract ttl), at {overdue.expires_at:%H:%M:%S.%f}"[:-3]
        + " UTC; raise ttl"
    )


def test_refusals_of_a_taken_message_say_whose_it_is_and_what_to_do(
    store: Store, clock: Clock
) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    claimed = mailbox.wait_for(subject="Verify your account")
    held = deliver(store, mailbox, subject="Held elsewhere")
    store.claim(  # a holder other than the mailbox's run, straight through the store
        mailbox_id=mailbox.mailbox_id,
        mailbox_fence=mailbox.fence,
        message_id=held,
        holder="r-elsewhere",
        lease=10,
    )

    with pytest.raises(AlreadyClaimed) as mine:
        mailbox.claim(claimed.message_id)
    with pytest.raises(AlreadyClaimed) as theirs:
        mailbox.claim(held)
    claimed.ack()
    with pytest.raises(AlreadyConsumed) as twice:
        claimed.ack()

    assert str(mine.value).startswith(
        f"claim {claimed.message_id}: already_claimed; this run holds it already, for 30s "
        "more, until "
    )
    assert str(mine.value).endswith(
        "UTC: use the ClaimedMessage that wait_for() or claim() returned, whose fence proves "
        "the claim"
    )
    assert str(twice.value) == (
        f"ack {claimed.message_id}: already_consumed; this run acked it already, and an ack is "
        "final: a message is consumed once, so nothing is left to ack, renew or release "
        "(retrying an ack that succeeded is a second click)"
    )
    assert str(theirs.value).startswith(
        f"claim {held}: already_claimed; run r-elsewhere holds it for 10s more, until "
    )
    assert str(theirs.value).endswith(
        "UTC: it can be claimed when that lease ends unacked, or wait_for() another message"
    )


def test_a_codes_digest_in_a_receipt_cannot_be_found_by_trying_every_code(
    store: Store, db: Path, tmp_path: Path
) -> None:
    mailbox = reserve_mailbox(store)
    mail = EmailMessage()
    mail["To"] = mailbox.address
    mail["Subject"] = "Your code"
    mail.set_content("Your code is 482913.")
    store.deliver(
        mail_from="noreply@app.example.test",
        deliveries=[Delivery(mailbox.address, mailbox.alias, None, mailbox.domain)],
        raw=mail.as_bytes(),
        subject="Your code",
        run_header=None,
    )
    code = mailbox.wait_for(subject="Your code").code()

    ((secret,),) = [m.secrets for m in mailbox.receipt().messages]

    # All a reader of the receipt can try: the 10,000 six-digit codes that end in last2.
    tried = {hashlib.sha256(f"{n:04d}{secret.last2}".encode()).hexdigest() for n in range(10**4)}
    assert secret.last2 == "13"
    assert secret.sha256 not in tried
    assert secret.sha256 == store.digest(code)[0]  # the store's key checks a value one knows
    with closing(Store(db)) as again:  # every process of the run has the same key
        assert again.digest(code) == store.digest(code)
    with closing(Store(tmp_path / "another-run.sqlite3")) as other:
        assert other.digest(code)[0] != secret.sha256


def test_wait_for_one_match_in_an_overdue_mailbox_raises_mailbox_closed(
    store: Store, clock: Clock
) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    clock.advance(CONTRACT.ttl)  # overdue, and nothing has written since

    with pytest.raises(MailboxClosed) as closed:
        mailbox.wait_for(subject="Verify your account", timeout=0)

    assert closed.value.status is Status.EXPIRED
    assert closed.value.result == {"status": "expired", "mailbox_id": mailbox.mailbox_id}
    assert [e["status"] for e in store.events(mailbox.mailbox_id)] == [
        "reserved",
        "received",
        "expired",
    ]


def test_wait_for_one_match_with_a_stale_mailbox_handle_raises_fence_mismatch(
    store: Store, clock: Clock
) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    stale = Mailbox(
        store, mailbox._row._replace(fence=mailbox.fence - 1), contract=CONTRACT, nodeid="t::x"
    )

    with pytest.raises(MailboxClosed) as closed:
        stale.wait_for(subject="Verify your account", timeout=0)

    assert closed.value.status is Status.FENCE_MISMATCH
    assert store.messages(mailbox.mailbox_id)[0].state == "waiting"


def test_mailbox_second_wait_does_not_reclaim_a_consumed_message(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    first = mailbox.wait_for(subject_contains="Verify")
    first.ack()

    with pytest.raises(
        TimeoutError, match=rf"{message_id}.*already consumed \(fence {first.fence}\)"
    ):
        mailbox.wait_for(subject_contains="Verify", timeout=0.05)


def test_mailbox_claim_by_selector_waits_then_claims(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)

    msg = mailbox.claim(subject_contains="Verify", lease=7, timeout=1)

    assert msg.message_id == message_id
    row = store.message(message_id)
    assert row is not None
    assert (row.state, row.fence, row.lease_until) == ("claimed", msg.fence, store.clock() + 7)
    with pytest.raises(ContractError, match="takes no selector or timeout"):
        mailbox.claim(message_id, subject="Verify your account")


def test_a_granted_claim_carries_the_bytes_but_never_tells_them(store: Store) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)

    granted = claim(store, mailbox, message_id)

    assert granted.raw == raw_message(mailbox.address)
    assert "raw" not in granted.as_dict()  # what an agent is told
    assert "8f3a9c77d1e24b6a" not in repr(granted)  # the link's token, e.g. in a log line
    assert claim(store, mailbox, message_id, holder="run-2").raw is None  # refused


def test_a_late_waiting_mark_never_moves_the_state_back(store: Store) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)
    claimed = claim(store, mailbox, message_id)
    assert store.ack(message_id, claimed.fence or 0).status is Status.CONSUMED

    store.mark(mailbox.mailbox_id, mailbox.fence, Status.WAITING, "a second handle waits")

    found = store.mailbox(mailbox.mailbox_id)
    assert found is not None
    assert found.state == "consumed"
    assert [e["status"] for e in store.events(mailbox.mailbox_id)][-1] == "waiting"


def test_a_claim_that_records_the_wait_leaves_waiting_then_claimed_in_order(
    store: Store, db: Path
) -> None:
    mailbox = reserve(store)
    message_id = deliver(store, mailbox)

    taken = claim(store, mailbox, message_id, waiting="subject='Verify your account'")

    assert taken.status is Status.CLAIMED
    assert rows(db, "SELECT state FROM mailboxes") == [("claimed",)]
    assert [e["status"] for e in store.events(mailbox.mailbox_id)][-2:] == ["waiting", "claimed"]


def test_a_refused_claim_that_records_the_wait_leaves_the_mailbox_waiting(
    store: Store, db: Path
) -> None:
    mine = reserve(store)
    other = reserve(store, run_id="run-2")
    theirs = deliver(store, other)

    refused = claim(store, mine, theirs, waiting="subject='Verify your account'")

    assert refused.status is Status.POLICY_DENIED
    # The wait goes on: the state says so, and the timeline has the step.
    assert rows(db, "SELECT state FROM mailboxes WHERE mailbox_id = ?", (mine.mailbox_id,)) == [
        ("waiting",)
    ]
    assert [e["status"] for e in store.events(mine.mailbox_id)] == ["reserved", "waiting"]


def test_a_fresh_reservation_returns_the_row_it_stored(store: Store, db: Path) -> None:
    row, created = store.reserve(
        run_id="r-new", purpose="verify", ttl=100, domain=DOMAIN, owner="t::x", fresh=True
    )

    assert created
    [stored] = rows(db, "SELECT * FROM mailboxes")
    assert tuple(row) == stored


def test_the_expiry_sweep_reads_only_open_mailboxes_through_their_index(store: Store) -> None:
    reserve(store)
    plan = store._conn().execute(
        f"EXPLAIN QUERY PLAN SELECT mailbox_id FROM mailboxes WHERE {_OPEN} AND expires_at <= ?",
        (T0,),
    )
    assert [row[3] for row in plan] == ["SEARCH mailboxes USING INDEX mailboxes_due (expires_at<?)"]


def test_the_lease_sweep_reads_only_claimed_messages_through_their_index(store: Store) -> None:
    plan = store._conn().execute(
        "EXPLAIN QUERY PLAN SELECT message_id FROM messages "
        "WHERE state = 'claimed' AND lease_until <= ?",
        (T0,),
    )
    assert [row[3] for row in plan] == [
        "SEARCH messages USING INDEX messages_leases (lease_until<?)"
    ]


def test_a_timeouts_look_for_earlier_runs_mail_reads_the_tests_mailboxes_by_index(
    store: Store,
) -> None:
    # Joined on the owner with no index on it and ordered by the message's seq, SQLite
    # scanned every message of the store, newest first, at each timeout: 150 ms with
    # 300,000 messages, and on in step with the store.
    plan = store._conn().execute(f"EXPLAIN QUERY PLAN {_EARLIER_RUNS_MAIL}", ("mbx-x", T0, 20))
    assert [row[3] for row in plan] == [
        "SEARCH b USING INDEX sqlite_autoindex_mailboxes_1 (mailbox_id=?)",
        "SEARCH o USING INDEX mailboxes_owner (owner=? AND testrun=?)",
        "SEARCH m USING INDEX messages_mailbox (mailbox_id=?)",
        "USE TEMP B-TREE FOR ORDER BY",
    ]


def test_the_cap_on_refused_steps_counts_them_through_their_own_index(store: Store) -> None:
    # The sink's event loop counts them at each refused RCPT for a test's alias: through the
    # timeline's key, SQLite read every step of the mailbox, and 2,000 refused RCPTs held
    # the loop 11 s for a mailbox of 100,000 steps, every worker's mail waiting on it.
    plan = store._conn().execute(
        f"EXPLAIN QUERY PLAN SELECT {_REFUSED_COUNT} FROM mailboxes WHERE mailbox_id = ?",
        ("mbx-x",),
    )
    assert "SEARCH e USING INDEX events_refused (mailbox_id=?)" in [row[3] for row in plan]


def test_a_timeline_is_stored_clustered_by_its_mailbox(store: Store, db: Path) -> None:
    first, second = reserve(store, run_id="run-a"), reserve(store, run_id="run-b")
    deliver(store, first)
    deliver(store, second)

    assert rows(db, "SELECT mailbox_id, event_id, status FROM events") == sorted(
        [
            (first.mailbox_id, 1, "reserved"),
            (first.mailbox_id, 2, "received"),
            (second.mailbox_id, 1, "reserved"),
            (second.mailbox_id, 2, "received"),
        ]
    )
    [(sql,)] = rows(db, "SELECT sql FROM sqlite_master WHERE name = 'events'")
    assert sql.endswith("WITHOUT ROWID")
    # Its one index holds the refused steps alone: a test's own steps write no page of it.
    assert rows(db, "SELECT name, sql FROM sqlite_master WHERE tbl_name = 'events'")[1:] == [
        (
            "events_refused",
            "CREATE INDEX events_refused ON events (mailbox_id) WHERE status = 'refused'",
        )
    ]


def test_fences_without_update_returning_still_only_grow(
    store: Store, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_module, "_RETURNING", False)  # SQLite before 3.35
    first = reserve(store, run_id="run-a")
    second = reserve(store, run_id="run-b")

    assert second.fence == first.fence + 1 == fence_counter(db)


OLD_SCHEMA = """
CREATE TABLE counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
INSERT INTO counters VALUES ('fence', 0);
CREATE TABLE mailboxes (mailbox_id TEXT PRIMARY KEY, run_id TEXT NOT NULL,
    purpose TEXT NOT NULL, alias TEXT NOT NULL UNIQUE, domain TEXT NOT NULL,
    owner TEXT NOT NULL, created_at REAL NOT NULL, expires_at REAL NOT NULL,
    fence INTEGER NOT NULL, state TEXT NOT NULL, close_reason TEXT, closed_at REAL);
CREATE INDEX mailboxes_key ON mailboxes (run_id, purpose, state);
CREATE INDEX mailboxes_expiry ON mailboxes (state, expires_at);
CREATE TABLE events (event_id INTEGER PRIMARY KEY AUTOINCREMENT, mailbox_id TEXT NOT NULL,
    at REAL NOT NULL, status TEXT NOT NULL, detail TEXT NOT NULL);
"""


def test_a_store_file_from_the_previous_schema_keeps_working(db: Path, clock: Clock) -> None:
    with closing(sqlite3.connect(db)) as conn:  # what 0.1.0.dev0 before this change wrote
        conn.executescript(OLD_SCHEMA)
    handle = Store(db, clock=clock)
    try:
        mailbox = Mailbox.reserve(handle, contract=CONTRACT, domain=DOMAIN)
        again = Mailbox.reserve(handle, contract=CONTRACT, domain=DOMAIN, run_id=mailbox.run_id)
        deliver(handle, mailbox)
        mailbox.wait_for(subject="Verify your account").ack()
        receipt = mailbox.close(success=True)
    finally:
        handle.close()

    assert again.mailbox_id == mailbox.mailbox_id
    assert [e.status for e in receipt.events] == [
        "reserved",
        "received",
        "waiting",
        "claimed",
        "consumed",
        "released",
    ]
    indexes = {name for (name,) in rows(db, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert {"mailboxes_run", "mailboxes_due"} <= indexes
    assert not {"mailboxes_key", "mailboxes_expiry"} & indexes


def test_the_previous_lease_index_gives_way_to_the_partial_one(db: Path) -> None:
    Store(db).close()
    with closing(sqlite3.connect(db)) as conn:  # what the previous version also had
        conn.execute("DROP INDEX messages_leases")
        conn.execute("CREATE INDEX messages_claimed ON messages (state, lease_until)")

    Store(db).close()

    indexes = {name for (name,) in rows(db, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert "messages_leases" in indexes
    assert "messages_claimed" not in indexes


def test_a_timeline_from_the_previous_schema_keeps_its_order(db: Path, clock: Clock) -> None:
    with closing(sqlite3.connect(db)) as conn:  # store-wide event ids, two mailboxes mixed
        conn.executescript(OLD_SCHEMA)
        conn.executemany(
            "INSERT INTO events (mailbox_id, at, status, detail) VALUES (?, ?, ?, '')",
            [("mbx-a", T0, "reserved"), ("mbx-b", T0, "reserved"), ("mbx-a", T0 + 1, "waiting")],
        )
        conn.commit()
    handle = Store(db, clock=clock)
    try:
        mailbox = Mailbox.reserve(handle, contract=CONTRACT, domain=DOMAIN)
        receipt = mailbox.close(success=True)
        kept = [(e["status"], e["at"]) for e in handle.events("mbx-a")]
    finally:
        handle.close()

    assert kept == [("reserved", T0), ("waiting", T0 + 1)]
    assert [e.status for e in receipt.events] == ["reserved", "released"]
    assert rows(db, "SELECT mailbox_id, event_id FROM events WHERE mailbox_id LIKE 'mbx-_'") == [
        ("mbx-a", 1),
        ("mbx-a", 3),
        ("mbx-b", 2),
    ]
    tables = {name for (name,) in rows(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    assert "events_v1" not in tables
    indexes = {name for (name,) in rows(db, "SELECT name FROM sqlite_master WHERE type='index'")}
    assert "events_refused" in indexes  # made again with the table: the cap's count reads it


def test_a_failed_history_read_leaves_the_connection_out_of_its_transaction(
    store: Store, db: Path
) -> None:
    mailbox = reserve(store)
    with closing(sqlite3.connect(db)) as conn:
        conn.execute("ALTER TABLE secrets RENAME TO gone")  # the last read of history fails

    with pytest.raises(StoreError, match=r"no such table: .*; nothing was read$") as failed:
        store.history(mailbox.mailbox_id)
    assert isinstance(failed.value.__cause__, sqlite3.OperationalError)
    assert failed.value.status is Status.PROVIDER_ERROR

    assert not store._conn().in_transaction
    assert store.mailbox(mailbox.mailbox_id) is not None  # and the next read sees the store


def test_closing_one_tests_orphans_leaves_every_other_mailbox_open(store: Store, db: Path) -> None:
    crashed, _ = store.reserve(
        run_id="run-1", purpose="verify", ttl=100, domain=DOMAIN, owner="t.py::test_crashed"
    )
    other, _ = store.reserve(
        run_id="run-2", purpose="verify", ttl=100, domain=DOMAIN, owner="t.py::test_other"
    )

    closed = store.close_orphans(owner="t.py::test_crashed", detail="worker gw1 crashed")

    assert closed == [crashed.mailbox_id]
    assert rows(db, "SELECT mailbox_id, state, close_reason FROM mailboxes ORDER BY owner") == [
        (crashed.mailbox_id, "released", "released_error"),  # its test never released it
        (other.mailbox_id, "reserved", None),
    ]
    assert [(e["status"], e["detail"]) for e in store.events(crashed.mailbox_id)][1:] == [
        ("orphaned", "worker gw1 crashed"),
        ("released", "released_error"),
    ]
    # The ttl it was given stays in its row and receipt: nothing ran out.
    assert store.mailbox(crashed.mailbox_id).expires_at == crashed.expires_at  # type: ignore[union-attr]
    assert store.close_orphans(owner="t.py::test_crashed") == []  # nothing open is left


def test_a_mailbox_whose_ttl_ran_out_is_expired_not_orphaned(store: Store, clock: Clock) -> None:
    overdue, _ = store.reserve(
        run_id="run-1", purpose="verify", ttl=5, domain=DOMAIN, owner="t.py::test_crashed"
    )
    clock.now += 5

    closed = store.close_orphans(owner="t.py::test_crashed", detail="worker gw1 crashed")

    assert closed == []  # it ended by its ttl: nothing follows its closing step
    assert [e["status"] for e in store.events(overdue.mailbox_id)] == ["reserved", "expired"]
    row = store.mailbox(overdue.mailbox_id)
    assert row is not None
    assert (row.state, row.close_reason) == ("expired", "expired_timeout")


def test_a_crash_closes_the_test_only_in_the_worker_that_crashed(db: Path, clock: Clock) -> None:
    """--dist each runs one test in every worker at once: gw1 dying must not end gw0's."""
    handles = {name: Store(db, clock=clock, worker=name) for name in ("gw0", "gw1")}
    try:
        mine = {
            name: handle.reserve(
                run_id=f"run-{name}", purpose="verify", ttl=100, domain=DOMAIN, owner="t::x"
            )[0]
            for name, handle in handles.items()
        }
        closed = handles["gw0"].close_orphans(owner="t::x", worker="gw1")
    finally:
        for handle in handles.values():
            handle.close()

    assert closed == [mine["gw1"].mailbox_id]
    assert (mine["gw0"].worker, mine["gw1"].worker) == ("gw0", "gw1")
    assert rows(db, "SELECT worker, state FROM mailboxes ORDER BY worker") == [
        ("gw0", "reserved"),
        ("gw1", "released"),
    ]


def test_write_paths_read_the_clock_inside_their_transaction(db: Path) -> None:
    """Waiting for the write lock must not stretch a lease: 'now' is taken under the lock."""
    inside: list[bool] = []

    def clock() -> float:
        inside.append(handle._conn(writer=True).in_transaction)
        return T0

    handle = Store(db, clock=clock)
    try:
        mailbox = reserve(handle)
        message_id = deliver(handle, mailbox)
        claimed = claim(handle, mailbox, message_id)
        handle.renew(message_id, claimed.fence or 0, 30)
        handle.ack(message_id, claimed.fence or 0)
        handle.release(mailbox.mailbox_id, mailbox.fence, CloseReason.RELEASED_SUCCESS)
        handle.reconcile()
    finally:
        handle.close()
    assert inside
    assert all(inside)


@pytest.mark.parametrize(
    ("table", "row_type"), [("mailboxes", MailboxRow), ("messages", MessageRow)]
)
def test_row_types_follow_their_tables_column_order(
    store: Store, table: str, row_type: type[MailboxRow | MessageRow]
) -> None:
    # Rows are built positionally from SELECT *: a reordered column would shift every field.
    columns = [info[1] for info in store._conn().execute(f"PRAGMA table_info({table})")]

    assert list(row_type._fields) == columns


def test_a_runs_end_closes_and_counts_only_its_own_mailboxes(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    first, second = Store(path, testrun="run-one"), Store(path, testrun="run-two")
    try:
        assert not first.other_runs("run-one")
        mine = reserve(first, run_id="r-1").mailbox_id
        theirs = reserve(second, run_id="r-2").mailbox_id
        assert first.other_runs("run-one")
        assert second.other_runs("run-two")

        assert first.close_orphans(testrun="run-one") == [mine]

        assert first.stats(testrun="run-one")["reserved"] == 1
        assert first.stats()["reserved"] == 2
        theirs_now = second.mailbox(theirs)
        assert theirs_now is not None
        assert theirs_now.state == "reserved"
        assert theirs_now.testrun == "run-two"
    finally:
        first.close()
        second.close()


def test_a_crashed_tests_mailboxes_are_those_of_its_own_run(tmp_path: Path) -> None:
    """Two runs given one --basetemp share the store, and their tests and workers have the
    same names: a crash report listed the other run's mailboxes of that test too."""
    path = tmp_path / "store.sqlite3"
    first = Store(path, worker="gw0", testrun="run-one")
    second = Store(path, worker="gw0", testrun="run-two")
    try:
        mine = reserve(first, run_id="r-1").mailbox_id
        reserve(second, run_id="r-2")  # the same test (t::x) in the same worker

        assert first.mailbox_ids(owner="t::x", worker="gw0", testrun="run-one") == [mine]
    finally:
        first.close()
        second.close()


def test_a_fault_armed_after_an_earlier_one_was_used_up_is_still_taken(store: Store) -> None:
    mb, _ = store.reserve(run_id="r", purpose="f", ttl=600, domain=DOMAIN)
    store.add_fault(mb.mailbox_id, mb.fence, stage="DATA", reply="451 4.3.0 First", times=1)
    assert store.take_fault(mb.alias, mb.domain, "DATA") == "451 4.3.0 First"
    store.add_fault(mb.mailbox_id, mb.fence, stage="DATA", reply="452 4.3.1 Second", times=1)

    assert store.take_fault(mb.alias, mb.domain, "DATA") == "452 4.3.1 Second"
    assert store.take_fault(mb.alias, mb.domain, "DATA") is None


def test_inject_fault_takes_up_to_a_thousand_times(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    mailbox.inject_fault(stage="DATA", times=1000)
    assert [e.status for e in mailbox.receipt().events].count("fault_armed") == 1


def test_a_wait_that_found_nothing_leaves_the_mailbox_waiting(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    with pytest.raises(WaitTimeout):
        mailbox.wait_for(timeout=0)
    assert mailbox.state == "waiting"
    assert store.mailbox(mailbox.mailbox_id).state == "waiting"


def test_renew_moves_the_claimed_messages_lease_until(store: Store, clock: Clock) -> None:
    mailbox = reserve_mailbox(store)
    deliver(store, mailbox)
    msg = mailbox.wait_for(lease=5)
    clock.advance(1)
    msg.renew(lease=20)
    assert msg.lease_until == utc(clock.now + 20)


def test_a_failed_tests_close_gives_back_only_its_own_claims(store: Store) -> None:
    mailbox = reserve_mailbox(store)
    message_id = deliver(store, mailbox)
    row = store.mailbox(mailbox.mailbox_id)
    assert claim(store, row, message_id, holder="another-run").status is Status.CLAIMED

    receipt = mailbox.close(success=False)

    assert "unclaimed" not in [e.status for e in receipt.events]  # never this run's claim


def test_a_store_used_as_a_context_manager_closes_its_connections(tmp_path: Path) -> None:
    """Python 3.13 warns (ResourceWarning) of a SQLite connection collected unclosed."""
    with Store(tmp_path / "store.sqlite3") as store:
        reserve_mailbox(store)
        opened = [conn for _, _, conn in store._connections]
    assert opened
    for conn in opened:
        with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
            conn.execute("SELECT 1")


def test_a_threads_connections_are_closed_once_another_thread_opens_its_own(
    store: Store,
) -> None:
    """A test that waits from a thread of its own (or ``AgentTools.acall``, in each async
    test's new executor) left its thread's two connections open until the run's end: two
    file descriptors each, and a page cache, test after test."""
    opened: list[tuple[sqlite3.Connection, sqlite3.Connection]] = []

    def one_test() -> None:
        mailbox = reserve_mailbox(store, run_id=f"r-{len(opened)}")
        deliver(store, mailbox)
        mailbox.wait_for(timeout=0).ack()
        opened.append((store._conn(), store._conn(writer=True)))  # the ones it used

    for _ in range(30):
        thread = threading.Thread(target=one_test)
        thread.start()
        thread.join()

    for conns in opened[:-1]:
        for conn in conns:
            with pytest.raises(sqlite3.ProgrammingError, match="closed database"):
                conn.execute("SELECT 1")
    for conn in opened[-1]:  # the last thread's: no thread has opened one since
        assert tuple(conn.execute("SELECT 1").fetchone()) == (1,)
    assert len(store._connections) == 4  # this thread's and the last one's


@pytest.mark.skipif(not hasattr(os, "fork"), reason="a child forked with the store open")
def test_a_forked_child_closes_no_connection_of_its_parent(store: Store) -> None:
    """A child a test forks (an app server, a multiprocessing worker) inherits the list of
    the store's connections, and there every thread of its parent counts as ended: its
    first thread to use the store closed the connections of threads still at work in the
    parent (SQLite: a child never uses one it inherited, closing included), and raised
    (AssertionError, RuntimeError on 3.13) on one of a thread ``threading`` did not start."""
    reserve_mailbox(store)
    used, working, finish = threading.Event(), threading.Event(), threading.Event()

    def foreign() -> None:  # a thread that threading did not start: a C library's, say
        store.data_version()
        used.set()

    def at_work() -> None:  # the parent's: the sink's, say
        store.data_version()
        working.set()
        finish.wait()

    _thread.start_new_thread(foreign, ())
    used.wait()
    parent = threading.Thread(target=at_work)
    parent.start()
    working.wait()
    inherited = [entry[-1] for entry in store._connections]  # (…, connection)
    ready, told = os.pipe()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: threads
            pid = os.fork()
        if pid == 0:  # the child: says what it saw, and leaves without pytest's teardown
            said = b"?"
            try:
                seen: list[str] = []
                child = threading.Thread(target=lambda: seen.append(str(store.data_version())))
                child.start()
                child.join()
                closed = [c for c in inherited if _is_closed(c)]
                said = f"{len(seen)} call(s), {len(closed)} inherited connection(s) closed"
                said = said.encode()
            finally:
                os.write(told, said)
                os._exit(0)
        os.close(told)
        assert os.read(ready, 200) == b"1 call(s), 0 inherited connection(s) closed"
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        finish.set()
        parent.join()
        os.close(ready)
    assert not any(_is_closed(conn) for conn in inherited)  # the parent's own, untouched


def _is_closed(conn: sqlite3.Connection) -> bool:
    try:
        conn.in_transaction  # noqa: B018 - sqlite3 refuses it on a closed connection alone
    except sqlite3.ProgrammingError:
        return True
    return False
