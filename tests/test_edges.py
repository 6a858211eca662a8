"""Exact boundaries and less-travelled refusals of the store, the mailbox and the sink.

Each test pins one rule that the rest of the suite reached only from one side: the
instant a lease or a ttl ends, a recipient at another accepted domain, a fault two sinks
read at once, a stale handle on an ack, a short code in an ambiguity's text. A mutation
audit (2026-12-06) found each rule could be broken with every other test still passing.
"""

from __future__ import annotations

import smtplib
from pathlib import Path

import pytest
from pydantic import ValidationError
from storekit import DOMAIN, Clock, claim, rows

from pytest_mailbox import (
    AmbiguousMatch,
    ContractError,
    EmailContract,
    Mailbox,
    MailboxClosed,
    MailSink,
    UnexpectedMessage,
    WaitTimeout,
)
from pytest_mailbox.contract import CloseReason, Status
from pytest_mailbox.store import SWEEP_EVERY, Delivery, Handle, MailboxRow, Store

CONTRACT = EmailContract(purpose="verify", ttl=120, lease=30, timeout=5)


def reserve(store: Store, run_id: str = "run-1", ttl: float = 100.0) -> MailboxRow:
    row, _ = store.reserve(run_id=run_id, purpose="verify", ttl=ttl, domain=DOMAIN, owner="t::x")
    return row


def raw(to: str, subject: str, extra: str = "", body: str = "body") -> bytes:
    return (
        f"From: noreply@app.example.test\r\nTo: {to}\r\nSubject: {subject}\r\n{extra}\r\n{body}\r\n"
    ).encode()


def deliver(
    store: Store,
    box: MailboxRow | Mailbox,
    *,
    alias: str | None = None,
    subject: str = "Verify",
    extra: str = "",
    body: str = "body",
) -> str:
    """Put one message for ``alias`` (the box's own by default) in the store, as the sink
    does; its message id."""
    alias, domain = alias or box.alias, box.domain
    to = f"{alias}@{domain}"
    [mid] = store.deliver(
        mail_from="noreply@app.example.test",
        deliveries=[Delivery(rcpt=to, alias=alias, tag=None, domain=domain)],
        raw=raw(to, subject, extra, body),
        subject=subject,
        run_header=None,
    )
    return mid


def mailbox(store: Store) -> Mailbox:
    return Mailbox.reserve(store, contract=CONTRACT, domain=DOMAIN, run_id="r-audit", nodeid="t::a")


def test_an_ack_under_a_stale_mailbox_handle_is_fence_mismatch(store: Store) -> None:
    box = reserve(store)
    held = claim(store, box, deliver(store, box))
    out = store.ack(held.message_id, held.fence, mailbox=Handle(box.mailbox_id, box.fence + 1))
    assert out.status is Status.FENCE_MISMATCH
    assert store.message(held.message_id).state == "claimed"


def test_a_lease_that_ends_now_can_be_claimed_by_another_run(store: Store, clock: Clock) -> None:
    box = reserve(store)
    first = claim(store, box, deliver(store, box), holder="run-1", lease=30)
    clock.advance(30)  # now == lease_until: the holder's ack would be lease_expired
    second = claim(store, box, first.message_id, holder="run-2", lease=30)
    assert second.status is Status.CLAIMED
    assert second.fence > first.fence


def test_a_passing_release_acks_only_its_own_holders_claims(store: Store) -> None:
    box = reserve(store, run_id="run-1")
    held = claim(store, box, deliver(store, box), holder="run-2")
    store.release(box.mailbox_id, box.fence, CloseReason.RELEASED_SUCCESS, ack_for="run-1")
    assert store.message(held.message_id).state == "waiting"


def test_a_write_at_the_exact_expiry_instant_between_sweeps_is_refused(
    store: Store, clock: Clock
) -> None:
    box = reserve(store, ttl=SWEEP_EVERY / 2)
    clock.advance(SWEEP_EVERY / 2)
    out = store.release(box.mailbox_id, box.fence, CloseReason.RELEASED_SUCCESS)
    assert out.status is Status.EXPIRED


def test_reconcile_at_the_exact_lease_end_lapses_it(store: Store, clock: Clock) -> None:
    box = reserve(store)
    claim(store, box, deliver(store, box), lease=30)
    clock.advance(30)
    assert store.reconcile() == {"mailboxes": 0, "leases": 1}


def test_the_alias_at_another_accepted_domain_is_not_routed(store: Store) -> None:
    box = reserve(store)
    to = f"{box.alias}@other.test"
    with (
        MailSink(store, domains=[DOMAIN, "other.test"]) as sink,
        smtplib.SMTP(sink.host, sink.port) as smtp,
    ):
        assert smtp.sendmail("a@app.example.test", [to], raw(to, "Verify")) == {}
    assert store.messages(box.mailbox_id) == []
    assert [r.rcpt for r in store.unrouted("other.test")] == [f"{box.alias}@other.test"]


def test_a_timeout_shows_mail_to_its_alias_at_another_accepted_domain(store: Store) -> None:
    """The alias right and the domain another (a second mailbox_allowed_domains entry): the
    timeout showed "no mail arrived", which sent the user to check the app's SMTP settings."""
    box = Mailbox.reserve(store, contract=EmailContract(purpose="verify"), domain=DOMAIN)
    to = f"{box.alias}@other.test"
    with (
        MailSink(store, domains=[DOMAIN, "other.test"]) as sink,
        smtplib.SMTP(sink.host, sink.port) as smtp,
    ):
        smtp.sendmail("a@app.example.test", [to], raw(to, "Verify"))
    with pytest.raises(WaitTimeout) as caught:
        box.wait_for(subject="Verify", timeout=0)
    (stray,) = [r.message_id for r in store.unrouted("other.test")]
    assert str(caught.value).splitlines()[1:] == [
        "near misses (1):",
        f"  - {stray} 'Verify': envelope recipient {to} is not {box.address}",
    ]
    box.close(success=True)


def test_a_fault_another_sink_took_meanwhile_is_not_answered_twice(
    store: Store, db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = reserve(store)
    assert (
        store.add_fault(box.mailbox_id, box.fence, stage="RCPT", reply="451 4.3.0 x", times=1)
        is None
    )
    seen = store.fault_pending(box.alias, box.domain, "RCPT")  # a second sink's read, first
    assert store.take_fault(box.alias, box.domain, "RCPT") == "451 4.3.0 x"
    monkeypatch.setattr(store, "fault_pending", lambda *args: seen)
    assert store.take_fault(box.alias, box.domain, "RCPT") is None
    assert rows(db, "SELECT remaining FROM faults") == [(0,)]


def test_wait_for_at_the_exact_lease_end_claims_the_message_again(
    store: Store, clock: Clock
) -> None:
    box = mailbox(store)
    deliver(store, box)
    first = box.wait_for(timeout=0)
    clock.advance(CONTRACT.lease)
    again = box.wait_for(timeout=0)
    assert (again.message_id, again.fence > first.fence) == (first.message_id, True)


def test_a_header_selector_matches_a_value_sent_with_trailing_blanks(store: Store) -> None:
    box = mailbox(store)
    deliver(store, box, extra="X-Order: 123  \r\n")
    assert box.wait_for(header=("X-Order", "123"), timeout=0).header("X-Order") == "123  "


def test_a_timeout_does_not_list_mail_for_an_unrelated_unknown_alias(store: Store) -> None:
    box = mailbox(store)
    stray = deliver(store, box, alias="zz-someone-else", subject="Other test's mail")
    with pytest.raises(WaitTimeout) as caught:
        box.wait_for(subject="Welcome", timeout=0)
    assert stray not in str(caught.value)
    assert "Other test" not in str(caught.value)


def test_an_ambiguous_match_masks_a_short_code_the_run_extracted(store: Store) -> None:
    box = mailbox(store)
    deliver(store, box, subject="Your code", body="Your code is QXKZ")
    code = box.wait_for(subject="Your code", timeout=0).code(pattern=r"code is ([A-Z]+)")
    assert code == "QXKZ"
    deliver(store, box, subject="Reminder")
    deliver(store, box, subject="Reminder")
    with pytest.raises(AmbiguousMatch) as caught:
        box.wait_for(subject_regex=f"Reminder|{code}", timeout=0)
    assert "QXKZ" not in str(caught.value)


def test_a_header_name_with_a_colon_is_refused(store: Store) -> None:
    box = mailbox(store)
    with pytest.raises(ContractError, match="a header name is printable ASCII without ':'"):
        box.wait_for(header=("X-Run-Id:", "r-1"), timeout=0)


def test_max_reads_zero_is_refused() -> None:
    with pytest.raises(ValidationError, match="max_reads"):
        EmailContract(max_reads=0)


def test_relaying_denied_quotes_at_most_100_characters_of_the_domain(store: Store) -> None:
    foreign = ".".join(["a" * 60] * 3) + ".example"
    with MailSink(store, domains=[DOMAIN]) as sink, smtplib.SMTP(sink.host, sink.port) as smtp:
        smtp.ehlo()
        smtp.mail("a@app.example.test")
        code, reply = smtp.rcpt(f"x@{foreign}")
    assert code == 550
    assert foreign[:100] in reply.decode()
    assert foreign not in reply.decode()


def test_a_checkpoint_on_a_released_mailbox_is_refused_as_every_call_is(store: Store) -> None:
    box = mailbox(store)
    box.release()
    with pytest.raises(MailboxClosed) as refused:
        box.checkpoint()
    assert refused.value.status is Status.RELEASED


def test_a_wait_with_a_timeout_of_zero_is_one_look_not_the_contracts_timeout(
    store: Store,
) -> None:
    box = mailbox(store)
    deliver(store, box, subject="Other")
    with pytest.raises(WaitTimeout) as caught:
        box.wait_for(subject="Verify", timeout=0)
    assert f"matched subject='Verify' within 0s (run {box.run_id}" in str(caught.value)


def test_expect_none_is_not_set_off_by_its_own_claim_whose_lease_ran_out(
    store: Store, clock: Clock
) -> None:
    box = mailbox(store)
    deliver(store, box)
    box.wait_for(subject="Verify", timeout=0)  # claimed, never acked
    clock.advance(CONTRACT.lease + 1)
    box.expect_none(within=0, subject="Verify")  # not news to this run


def test_an_unexpected_message_masks_a_short_code_the_run_extracted(store: Store) -> None:
    box = mailbox(store)
    deliver(store, box, subject="Your code", body="Your code is QXKZ")
    code = box.wait_for(subject="Your code", timeout=0).code(pattern=r"code is ([A-Z]+)")
    assert code == "QXKZ"
    deliver(store, box, subject="Reminder", body=f"Your code is still {code}")
    with pytest.raises(UnexpectedMessage) as caught:
        box.expect_none(within=0, body_contains=code)
    assert "QXKZ" not in str(caught.value)


def test_an_ack_after_the_mailbox_outlived_its_ttl_says_to_raise_ttl(
    store: Store, clock: Clock
) -> None:
    box = mailbox(store)
    deliver(store, box)
    held = box.wait_for(timeout=0)
    clock.advance(CONTRACT.ttl)
    with pytest.raises(MailboxClosed) as refused:
        held.ack()
    assert refused.value.status is Status.EXPIRED
    assert str(refused.value).startswith(
        f"ack {held.message_id}: expired; mailbox {box.address} (test t::a) outlived its ttl "
        "of 120s (email_contract ttl)"
    )


def test_a_fault_for_a_released_mailbox_is_refused(store: Store) -> None:
    box = mailbox(store)
    box.release()
    with pytest.raises(MailboxClosed) as refused:
        box.inject_fault(stage="RCPT")
    assert refused.value.status is Status.RELEASED
