"""The matching contract (DESIGN §4): only this run's routed, new, selected mail is a candidate."""

from __future__ import annotations

import asyncio
import math
import re
import smtplib
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from email.message import EmailMessage
from pathlib import Path
from typing import Any

import pytest

from pytest_mailbox import (
    AmbiguousMatch,
    ContractError,
    EmailContract,
    ExtractionError,
    Mailbox,
    MailboxClosed,
    MailSink,
    Store,
    UnexpectedMessage,
    WaitTimeout,
)
from pytest_mailbox.contract import (
    SELECTOR_FIELDS,
    Checkpoint,
    Selector,
    Status,
    dump_receipt,
    utc,
)
from pytest_mailbox.mailbox import POLL_FIRST, POLL_INTERVAL
from pytest_mailbox.message import Message
from pytest_mailbox.sink import Signal
from pytest_mailbox.store import Delivery, Outcome

#: The real wait of a test that expects nothing: long enough to scan, short for the suite.
SHORT = 0.2


def mail(
    to: str,
    subject: str = "Welcome",
    *,
    sender: str = "App <noreply@app.example.test>",
    text: str = "Hello!\n",
    html: str | None = None,
    headers: dict[str, str] | None = None,
) -> EmailMessage:
    """A small message; ``headers`` adds extra ones such as X-Run-Id."""
    message = EmailMessage()
    message["From"] = sender
    message["To"] = to
    message["Subject"] = subject
    for name, value in (headers or {}).items():
        message[name] = value
    message.set_content(text)
    if html is not None:
        message.add_alternative(html, subtype="html")
    return message


def send(server: MailSink, message: EmailMessage, to: list[str] | None = None) -> None:
    """Deliver over real SMTP; the sink commits before it answers 250."""
    with smtplib.SMTP(server.host, server.port) as smtp:
        assert smtp.send_message(message, to_addrs=to) == {}


def ids(store: Store, mailbox: Mailbox) -> list[str]:
    return [row.message_id for row in store.messages(mailbox.mailbox_id)]


def test_a_mailbox_written_as_text_is_its_address(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # an app handed the mailbox (a form's field, f"{isolated_mailbox}") sent to its repr,
    # "<Mailbox mail-…@mailbox.test run=r-… id=mbx-…>", refused 550 for a domain
    # "mailbox.testrun=r-…"
    assert str(isolated_mailbox) == f"{isolated_mailbox}" == isolated_mailbox.address
    assert repr(isolated_mailbox).startswith(f"<Mailbox {isolated_mailbox.address} run=r-")
    isolated_mailbox.checkpoint()
    send(mailbox_server, mail(str(isolated_mailbox)))
    isolated_mailbox.wait_for(subject="Welcome", timeout=10).ack()


# -- received_after --------------------------------------------------------------------------


def test_message_sent_before_checkpoint_is_not_matched(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    (old,) = ids(mailbox_store, isolated_mailbox)
    isolated_mailbox.checkpoint()

    with pytest.raises(WaitTimeout, match=f"{old} 'Welcome': received before received_after"):
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    send(mailbox_server, mail(isolated_mailbox.address))
    msg = isolated_mailbox.wait_for(subject="Welcome", timeout=10)
    assert msg.message_id != old
    assert ids(mailbox_store, isolated_mailbox) == [old, msg.message_id]


@pytest.mark.parametrize(
    ("after", "shown"),
    [
        (datetime(2026, 12, 3, 16, 30, 5, tzinfo=timezone.utc), "2026-12-03T16:30:05+00:00"),
        (1796315405.25, "1796315405.25 (2026-12-03T16:30:05.250000+00:00)"),
        (Checkpoint(seq=12345, at=1796315405.5), "seq=12345, at=2026-12-03T16:30:05.500000"),
    ],
)
def test_a_timeout_shows_received_after_as_a_time_not_masked_digits(
    isolated_mailbox: Mailbox, after: datetime | float | Checkpoint, shown: str
) -> None:
    with pytest.raises(WaitTimeout) as excinfo:
        isolated_mailbox.wait_for(subject="Welcome 2026", received_after=after, timeout=SHORT)

    text = str(excinfo.value)
    assert shown in text
    assert "subject='Welcome ••26'" in text  # a value a test copied from mail stays masked


FINITE = "a POSIX timestamp is a finite number of seconds within years 1..9999"


@pytest.mark.parametrize(
    ("after", "why"),
    [
        pytest.param(math.nan, FINITE, id="nan"),
        pytest.param(-math.inf, FINITE, id="-inf"),
        pytest.param(1e20, FINITE, id="year-past-9999"),
        pytest.param(10**400, FINITE, id="int-past-any-float"),
        pytest.param(True, "a bool is no point in time", id="bool"),
        pytest.param(
            datetime(2026, 12, 3, 16, 30),  # no time zone: the point
            "a datetime without a time zone is ambiguous; pass an aware one, such as "
            "datetime.now(timezone.utc)",
            id="naive-datetime",
        ),
        pytest.param("2026-12-03T16:30:00Z", "a str is no point in time", id="text"),
    ],
)
def test_received_after_that_is_no_point_in_time_is_refused_not_read_as_any_time(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, after: object, why: str
) -> None:
    # NaN compared false with every time and let the mail before the checkpoint through.
    send(mailbox_server, mail(isolated_mailbox.address))
    isolated_mailbox.checkpoint()

    with pytest.raises(ContractError) as caught:
        isolated_mailbox.wait_for(received_after=after, timeout=SHORT)

    assert str(caught.value) == (
        f"selector: received_after={after!r} is invalid: {why} (allowed: a "
        "checkpoint(), a datetime with a time zone or a finite POSIX timestamp)"
    )
    assert "claimed" not in [event.status for event in isolated_mailbox.receipt().events]


def test_a_messages_own_received_at_as_received_after_finds_it_every_time(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    # received_at is shown to the microsecond; the store keeps more digits. Compared as
    # stored, a message was "before" its own shown time about half of the time.
    for n in range(30):
        send(mailbox_server, mail(isolated_mailbox.address, f"Welcome {n}"))
        row = mailbox_store.messages(isolated_mailbox.mailbox_id)[-1]
        shown = utc(row.received_at)  # what Message.received_at and receipts show
        for after in (shown, shown.timestamp()):
            with pytest.raises(UnexpectedMessage):
                isolated_mailbox.expect_none(within=0, subject=f"Welcome {n}", received_after=after)


def test_explicit_received_after_selects_the_later_message(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    since = mailbox_store.checkpoint()
    send(mailbox_server, mail(isolated_mailbox.address))
    old, new = ids(mailbox_store, isolated_mailbox)

    msg = isolated_mailbox.wait_for(subject="Welcome", received_after=since, timeout=10)

    assert msg.message_id == new != old


# -- routing: only this mailbox's envelope recipient -----------------------------------------


def test_mail_to_another_tests_alias_is_not_matched(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    second_mailbox: Mailbox,
) -> None:
    send(mailbox_server, mail(second_mailbox.address))

    with pytest.raises(WaitTimeout, match=f"^no message for {isolated_mailbox.address} matched"):
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    assert ids(mailbox_store, isolated_mailbox) == []
    assert second_mailbox.wait_for(subject="Welcome", timeout=10).envelope_to == (
        second_mailbox.address
    )


@pytest.mark.parametrize("variant", ["prefix", "suffix"])
def test_look_alike_alias_is_not_matched(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    variant: str,
) -> None:
    alias = f"x{isolated_mailbox.alias}" if variant == "prefix" else f"{isolated_mailbox.alias}x"
    look_alike = f"{alias}@{isolated_mailbox.domain}"
    send(mailbox_server, mail(look_alike))

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    assert ids(mailbox_store, isolated_mailbox) == []
    (row,) = [r for r in mailbox_store.unrouted(isolated_mailbox.domain) if r.rcpt == look_alike]
    assert row.mailbox_id is None
    assert (
        f"  - {row.message_id} 'Welcome': envelope recipient {look_alike} is not "
        f"{isolated_mailbox.address}"
    ) in str(caught.value).splitlines()


@pytest.mark.parametrize("variant", ["two-typos", "long-suffix", "cut-short"])
def test_a_timeout_lists_each_kind_of_look_alike_alias(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, variant: str
) -> None:
    # Each look-alike passes one test of three: close spelling (two letters wrong), the
    # alias inside a longer one, a shorter one inside the alias.
    alias = isolated_mailbox.alias
    look_alike = {
        "two-typos": f"{alias[:-2]}{'zz' if alias[-2:] != 'zz' else 'yy'}",
        "long-suffix": f"{alias}-and-a-long-tail-of-words",
        "cut-short": alias[: len(alias) // 2],
    }[variant]
    address = f"{look_alike}@{isolated_mailbox.domain}"
    send(mailbox_server, mail(address))

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    assert f"envelope recipient {address} is not {isolated_mailbox.address}" in str(caught.value)


def test_a_look_alike_alias_s_token_like_tag_is_masked_in_a_timeout(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # A reply-by-mail token in the tag of a typo'd address, shown as an address shows it.
    look_alike = f"x{isolated_mailbox.alias}+reply-3f9a1c07be52d8e4@{isolated_mailbox.domain}"
    send(mailbox_server, mail(look_alike))

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    text = str(caught.value)
    assert "3f9a1c07be52d8e4" not in text
    assert f"envelope recipient x{isolated_mailbox.alias}+••••" in text


def test_to_header_naming_us_with_another_envelope_recipient_is_not_matched(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    second_mailbox: Mailbox,
) -> None:
    raw = mail(isolated_mailbox.address).as_bytes()
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        assert smtp.sendmail("noreply@app.example.test", [second_mailbox.address], raw) == {}

    with pytest.raises(WaitTimeout):
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    assert ids(mailbox_store, isolated_mailbox) == []
    delivered = second_mailbox.wait_for(subject="Welcome", timeout=10)
    assert delivered.to == [isolated_mailbox.address]
    assert delivered.envelope_to == second_mailbox.address


def test_a_plus_tag_tells_a_second_address_of_the_test_from_its_own(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # An invitation to a friend and the inviter's own copy: the same subject, both routed
    # here; only the envelope recipient's tag tells them apart.
    friend = isolated_mailbox.tagged("Friend")
    assert friend == f"{isolated_mailbox.alias}+friend@{isolated_mailbox.domain}"
    send(mailbox_server, mail(isolated_mailbox.address, "You invited a friend"))
    send(mailbox_server, mail(friend, "You invited a friend"))

    with pytest.raises(AmbiguousMatch):
        isolated_mailbox.wait_for(subject="You invited a friend", timeout=10)
    # tag="" first, while both are there: it takes mail to the alias alone, not any tag
    mine = isolated_mailbox.wait_for(subject="You invited a friend", tag="", timeout=10)
    theirs = isolated_mailbox.wait_for(subject="You invited a friend", tag="FRIEND", timeout=10)

    assert theirs.envelope_to == friend
    assert mine.envelope_to == isolated_mailbox.address
    # and the receipt says which address each message came to
    assert [m.tag for m in isolated_mailbox.receipt().messages] == [None, "friend"]


def test_mail_to_an_empty_tag_counts_as_mail_to_the_alias_alone(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    empty = f"{isolated_mailbox.alias}+@{isolated_mailbox.domain}"
    send(mailbox_server, mail(empty))

    got = isolated_mailbox.wait_for(subject="Welcome", tag="", timeout=10)

    assert got.envelope_to == empty
    assert [m.tag for m in isolated_mailbox.receipt().messages] == [None]


def test_tagged_keeps_the_local_part_within_64_octets(isolated_mailbox: Mailbox) -> None:
    room = 64 - len(isolated_mailbox.alias) - 1

    local = isolated_mailbox.tagged("t" * room).rpartition("@")[0]
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.tagged("t" * (room + 1))

    assert len(local) == 64  # as long as RFC 5321 allows, and no longer
    assert str(caught.value).endswith(
        f"allowed: a plus-tag of at most {room} characters beside the alias "
        f"{isolated_mailbox.alias}"
    )
    # RFC 5321 counts octets: a tag beyond ASCII takes two to four of them a character
    assert isolated_mailbox.tagged("\u00e9" * (room // 2)).isascii() is False
    with pytest.raises(ContractError, match=f"at most {room} octets of UTF-8 beside the alias"):
        isolated_mailbox.tagged("\u00e9" * (room // 2 + 1))


def test_a_wait_for_another_tag_times_out_saying_each_message_s_tag(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    send(mailbox_server, mail(isolated_mailbox.tagged("friend")))

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", tag="colleague", timeout=SHORT)

    text = str(caught.value)
    assert "matched subject='Welcome', tag='colleague' within" in text
    assert "'Welcome': its tag is none (sent to the alias alone), not 'colleague'" in text
    assert "'Welcome': its tag is 'friend', not 'colleague'" in text


def test_a_tag_that_looks_like_a_token_is_masked_as_an_address_s_is(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # A reply-by-mail style tag: its address is masked (mask_address) wherever it shows,
    # and so is the tag alone in a near miss, the selector's description and the timeline.
    secrets = ["reply-3f9a1c07be52d8e4", "a1b2c3d4"]
    for tag in secrets:
        send(mailbox_server, mail(isolated_mailbox.tagged(tag)))

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(tag="reply-3f9a1c07be52d8e5", timeout=SHORT)

    text = str(caught.value)
    receipt = isolated_mailbox.receipt()
    timeline = receipt.timeline()
    assert "its tag is '••••••••••••••••••••e4', not '••••••••••••••••••••e5'" in text
    assert "its tag is '••••••d4', not " in text
    assert [m.tag for m in receipt.messages] == ["••••••••••••••••••••e4", "••••••d4"]
    for secret in [*secrets, "reply-3f9a1c07be52d8e5"]:
        assert secret not in text
        assert secret not in timeline


@pytest.mark.parametrize("tag", ["friend.", "a..b"])
def test_tagged_refuses_a_tag_that_would_make_no_address(
    isolated_mailbox: Mailbox, tag: str
) -> None:
    # alias+friend.@domain is no dot-atom: Django's validate_email and email-validator
    # refuse it, so the app under test would never send there.
    with pytest.raises(ContractError, match=r"^tagged: tag=.* is invalid; allowed: .*'\.\.'"):
        isolated_mailbox.tagged(tag)


def test_tagged_masks_a_refused_tag_that_looks_like_a_token(isolated_mailbox: Mailbox) -> None:
    """A tag is masked wherever it is shown, as in an address: a refusal quoted it in clear."""
    token = "Zq8xYtK2mP4vL9wR3nB7"
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.tagged(f"{token}.")

    assert token not in str(caught.value)
    assert str(caught.value).startswith("tagged: tag='•••")


@pytest.mark.parametrize(
    "tag", ["a b", "friend@x", "", "x" * 65, 7, "\u00e9" * 33, "a\u3000b", "a\u200eb"]
)
def test_tagged_refuses_what_no_address_could_carry(isolated_mailbox: Mailbox, tag: Any) -> None:
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.tagged(tag)

    assert str(caught.value).startswith(f"tagged: tag={tag!r} is invalid; allowed: a plus-tag ")
    if tag != "":  # the selector takes '' (the alias alone), and nothing else of these
        with pytest.raises(ContractError, match=r"^selector: tag=.* is invalid: "):
            isolated_mailbox.wait_for(tag=tag, timeout=SHORT)


# -- run correlation header ------------------------------------------------------------------


def test_x_run_id_of_another_run_is_never_a_candidate(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    foreign_run = "r-0123456789abcdef"
    assert foreign_run != isolated_mailbox.run_id
    send(mailbox_server, mail(isolated_mailbox.address, headers={"X-Run-Id": foreign_run}))
    (foreign,) = ids(mailbox_store, isolated_mailbox)

    reason = f"{foreign} 'Welcome': X-Run-Id belongs to run {foreign_run}"
    with pytest.raises(WaitTimeout, match=reason):
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    send(
        mailbox_server,
        mail(isolated_mailbox.address, headers={"X-Run-Id": isolated_mailbox.run_id}),
    )
    msg = isolated_mailbox.wait_for(subject="Welcome", timeout=10)
    assert msg.message_id != foreign
    assert msg.run_header() == isolated_mailbox.run_id


# -- ambiguity, near misses, expect_none -----------------------------------------------------


def test_two_matching_messages_are_ambiguous_and_neither_is_claimed(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, "Welcome aboard"))
    send(mailbox_server, mail(isolated_mailbox.address, "Welcome back"))
    first, second = ids(mailbox_store, isolated_mailbox)

    with pytest.raises(AmbiguousMatch) as caught:
        isolated_mailbox.wait_for(subject_contains="Welcome", timeout=10)

    assert str(caught.value) == (
        f"2 messages for {isolated_mailbox.address} match subject_contains='Welcome': "
        f"{first} ('Welcome aboard'), {second} ('Welcome back'); "
        "make the selector stricter (subject=, header=, received_after=)"
    )
    assert caught.value.result["message_ids"] == [first, second]
    assert caught.value.result["status"] == "ambiguous"
    rows = mailbox_store.messages(isolated_mailbox.mailbox_id)
    assert [(r.state, r.fence) for r in rows] == [("waiting", None), ("waiting", None)]


def test_the_timeline_records_each_new_wait_once(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # A test cut short in its second wait (pytest-timeout) showed only its first: the
    # timeline ended at the first message's claim, with no sign of what it hung in.
    send(mailbox_server, mail(isolated_mailbox.address))
    isolated_mailbox.wait_for(subject="Welcome", timeout=10).ack()
    for _ in range(2):  # a retry of the same wait is no new step
        with pytest.raises(WaitTimeout):
            isolated_mailbox.wait_for(subject="Reset", timeout=0)

    events = isolated_mailbox.receipt().events
    assert [(e.status, e.detail) for e in events if e.status == "waiting"] == [
        ("waiting", "subject='Welcome'"),
        ("waiting", "subject='Reset'"),
    ]
    assert [e.status for e in events][-2:] == ["consumed", "waiting"]


def test_a_wait_after_a_claim_records_its_step_though_it_waits_for_the_same(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # The resend pattern: the second wait for "Verify" is no retry of the first, which got
    # its message; a test that hangs in it must show it.
    send(mailbox_server, mail(isolated_mailbox.address, "Verify"))
    isolated_mailbox.wait_for(subject="Verify", timeout=10).ack()
    isolated_mailbox.checkpoint()
    with pytest.raises(WaitTimeout):
        isolated_mailbox.wait_for(subject="Verify", timeout=0)

    events = [e.status for e in isolated_mailbox.receipt().events]
    assert events[-3:] == ["claimed", "consumed", "waiting"]
    assert events.count("waiting") == 2


def test_a_wait_after_a_claim_by_id_records_its_step_too(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    with pytest.raises(WaitTimeout):
        isolated_mailbox.wait_for(subject="Verify", timeout=0)
    send(mailbox_server, mail(isolated_mailbox.address, "Verify"))
    (message_id,) = ids(mailbox_store, isolated_mailbox)
    isolated_mailbox.claim(message_id).ack()
    with pytest.raises(WaitTimeout):
        isolated_mailbox.wait_for(subject="Verify", timeout=0)

    events = [e.status for e in isolated_mailbox.receipt().events]
    assert events.count("waiting") == 2
    assert events[-1] == "waiting"


def test_two_waits_at_once_for_two_things_record_one_step_each(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # Each mark woke the other wait, which marked again: about 190 steps a second.
    def wait(subject: str) -> None:
        with pytest.raises(WaitTimeout):
            isolated_mailbox.wait_for(subject=subject, timeout=0.5)

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(wait, ["A", "B"]))

    steps = [e.detail for e in isolated_mailbox.receipt().events if e.status == "waiting"]
    assert sorted(steps) == ["subject='A'", "subject='B'"]


def test_an_ambiguous_match_masks_the_codes_and_links_of_the_subjects_it_lists(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # Nobody extracted them: a subject is shown as every error shows one (mask_subject).
    send(mailbox_server, mail(isolated_mailbox.address, "Your code is 483920"))
    send(mailbox_server, mail(isolated_mailbox.address, "Your link https://app.test/v?t=Zq8xYtK2"))

    with pytest.raises(AmbiguousMatch) as caught:
        isolated_mailbox.wait_for(subject_contains="Your", timeout=10)

    text = str(caught.value)
    assert "('Your code is ••••20')" in text
    assert "('Your link https://app.test/…?t=…')" in text
    assert "483920" not in text
    assert "Zq8xYtK2" not in text


def test_a_receipt_lists_each_secret_under_the_message_it_came_from(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, "Welcome", text="No code here.\n"))
    send(mailbox_server, mail(isolated_mailbox.address, "Your code", text="Code: 483920\n"))
    isolated_mailbox.wait_for(subject="Your code", timeout=10).code()

    welcome, coded = isolated_mailbox.receipt().messages

    assert (welcome.subject, welcome.secrets) == ("Welcome", [])
    assert [(s.kind, s.last2) for s in coded.secrets] == [("code", "20")]


def test_timeout_text_lists_every_near_miss_with_its_reason(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
) -> None:
    box = isolated_mailbox
    send(mailbox_server, mail(box.address, "Welcome"))  # too old
    box.checkpoint()
    send(mailbox_server, mail(box.address, "Welcome"))  # consumed below
    consumed = box.wait_for(subject="Welcome", timeout=10)
    consumed.ack()
    send(mailbox_server, mail(box.address, "Newsletter"))
    send(mailbox_server, mail(box.address, "Welcome", headers={"X-Run-Id": "r-someone-else"}))
    unknown = f"{box.alias[:-1]}@{box.domain}"  # a typo of our alias: unrouted, but similar
    send(mailbox_server, mail(unknown, "Welcome"))
    old, consumed_id, newsletter, foreign = ids(mailbox_store, box)
    assert consumed_id == consumed.message_id
    (stray,) = [r.message_id for r in mailbox_store.unrouted(box.domain) if r.rcpt == unknown]

    with pytest.raises(WaitTimeout) as caught:
        box.wait_for(subject="Welcome", timeout=SHORT)

    assert str(caught.value) == "\n".join(
        [
            f"no message for {box.address} matched subject='Welcome' within 0.2s "
            f"(run {box.run_id}, mailbox {box.mailbox_id})",
            "near misses (5):",
            f"  - {old} 'Welcome': received before received_after",
            f"  - {consumed_id} 'Welcome': already consumed (fence {consumed.fence})",
            f"  - {newsletter} 'Newsletter': subject is not 'Welcome'",
            f"  - {foreign} 'Welcome': X-Run-Id belongs to run r-someone-else",
            f"  - {stray} 'Welcome': envelope recipient {unknown} is not {box.address}",
        ]
    )
    assert caught.value.result["status"] == "waiting"


def test_expect_none_passes_when_only_non_matching_mail_arrives(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, "Newsletter"))

    isolated_mailbox.expect_none(within=SHORT, subject="Welcome")

    (row,) = mailbox_store.messages(isolated_mailbox.mailbox_id)
    assert (row.subject, row.state) == ("Newsletter", "waiting")


def test_expect_none_raises_when_a_matching_message_arrives(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, "Newsletter"))
    with ThreadPoolExecutor(1) as pool:
        sent = pool.submit(send, mailbox_server, mail(isolated_mailbox.address, "Welcome"))
        with pytest.raises(UnexpectedMessage) as caught:
            isolated_mailbox.expect_none(within=10, subject="Welcome")
        sent.result()

    _, welcome = ids(mailbox_store, isolated_mailbox)
    assert str(caught.value) == (
        f"expected no message for {isolated_mailbox.address} matching subject='Welcome' "
        f"within 10s, but {welcome} ('Welcome') arrived"
    )
    assert caught.value.result["message_id"] == welcome
    assert isinstance(caught.value, AssertionError)


# -- waking: mail another process's sink took -----------------------------------------------


@pytest.fixture
def handles(db: Path) -> Iterator[Callable[[], Store]]:
    """Opens store handles on one file, each with its own connections (as another process
    has), on the real clock; closes them after the test."""
    opened: list[Store] = []

    def open_handle() -> Store:
        opened.append(Store(db))
        return opened[-1]

    yield open_handle
    for handle in opened:
        handle.close()


class _Pauses(Signal):
    """A waiter's in-process signal that no sink notifies: it records every pause the
    waiter takes, and runs ``first`` once, as the waiter first goes to sleep."""

    def __init__(self, first: Callable[[], object] | None = None) -> None:
        super().__init__()
        self.pauses: list[float] = []
        self._first = first

    def wait(self, seen: int, timeout: float) -> int:
        self.pauses.append(timeout)
        if self._first is not None:
            first, self._first = self._first, None
            first()
        return super().wait(seen, timeout)


def test_mail_another_processs_sink_took_is_seen_at_the_first_look(
    handles: Callable[[], Store],
) -> None:
    """The waiter's own signal never fires: only its look at ``PRAGMA data_version`` can
    find the mail, which a sink on another connection commits once the waiter sleeps."""
    other = MailSink(handles(), domains=["mailbox.test"], name="other").start()
    try:
        store = handles()
        pauses = _Pauses(first=lambda: send(other, mail(box.address, "From elsewhere")))
        box = Mailbox.reserve(store, contract=EmailContract(), domain="mailbox.test", signal=pauses)

        claimed = box.wait_for(subject="From elsewhere", timeout=10)

        row = store.message(claimed.message_id)
        assert row is not None
        assert row.sink == "other"  # taken by the other connection's sink
        assert pauses.pauses == [0.001]  # woken by the first look, 1 ms in
    finally:
        other.stop()


def _assert_taken_again_when_its_lease_ends(store: Store, sink: MailSink, pauses: _Pauses) -> None:
    """A message claimed under a short lease and never acked: a second wait for it takes
    it once the lease ends, with a newer fence. The mailbox closes long before that wait's
    deadline, so a wait that slept to its deadline finds it closed instead."""
    contract = EmailContract(ttl=20)
    box = Mailbox.reserve(store, contract=contract, domain="mailbox.test", signal=pauses)
    send(sink, mail(box.address))
    held = box.wait_for(subject="Welcome", timeout=10, lease=0.5)  # never acked

    again = box.wait_for(subject="Welcome", timeout=60)

    assert (again.message_id, again.fence > held.fence) == (held.message_id, True)


def test_a_wait_still_wakes_when_its_lease_ends_after_other_news_woke_it_first(
    handles: Callable[[], Store],
) -> None:
    """Under xdist other tests write to the store while a wait sleeps, and each write
    wakes it to look. That look forgot the lease it was to wake for, so the wait slept to
    its deadline: here another test reserves a mailbox as the wait first sleeps."""
    store = handles()
    sink = MailSink(store, domains=["mailbox.test"], name="main").start()
    try:
        other = handles()
        pauses = _Pauses(
            first=lambda: Mailbox.reserve(other, contract=EmailContract(), domain="mailbox.test")
        )
        _assert_taken_again_when_its_lease_ends(store, sink, pauses)
    finally:
        sink.stop()


class _SetBack:
    """The real clock, until ``set_back`` moves it back by ``step``: an NTP step."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.offset = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset

    def set_back(self) -> None:
        self.offset -= self.step


@pytest.mark.parametrize("step", [0.2, 2.0], ids=["within-the-lease", "past-where-it-began"])
def test_a_wait_wakes_when_its_lease_ends_though_the_store_clock_was_set_back_meanwhile(
    handles: Callable[[], Store], db: Path, step: float
) -> None:
    """When the wait wakes, the lease still holds on a store clock set back while it slept:
    it reckons the wake-up again. Before, a clock further back than where the wait first
    reckoned counted as one that stands still, and the wait slept to its deadline; one
    that still moved forward must not be taken for it either."""
    clock = _SetBack(step)
    sink = MailSink(handles(), domains=["mailbox.test"], name="main").start()
    try:
        with Store(db, clock=clock) as store:
            _assert_taken_again_when_its_lease_ends(store, sink, _Pauses(first=clock.set_back))
    finally:
        sink.stop()


def test_a_waiter_looks_at_the_store_quickly_first_then_every_poll_interval(
    handles: Callable[[], Store],
) -> None:
    pauses = _Pauses()
    box = Mailbox.reserve(handles(), contract=EmailContract(), domain="mailbox.test", signal=pauses)

    with pytest.raises(WaitTimeout):
        box.wait_for(subject="Never sent", timeout=1.0)

    ramp = [POLL_FIRST * 2**i for i in range(4)]
    assert ramp == [0.001, 0.002, 0.004, 0.008]
    assert pauses.pauses[:4] == ramp  # its own `waiting` mark is no news to it
    assert POLL_INTERVAL in pauses.pauses  # then the steady interval, to the deadline
    assert max(pauses.pauses) == POLL_INTERVAL


def test_news_that_is_not_the_mail_does_not_start_the_looks_over(
    handles: Callable[[], Store],
) -> None:
    """Under xdist other workers commit all the time: each commit makes the waiter scan
    again, but its looks keep slowing down to the steady interval."""
    other = handles()  # another worker, to SQLite: its own connections
    pauses = _Pauses(
        first=lambda: Mailbox.reserve(other, contract=EmailContract(), domain="mailbox.test")
    )
    box = Mailbox.reserve(handles(), contract=EmailContract(), domain="mailbox.test", signal=pauses)

    with pytest.raises(WaitTimeout):
        box.wait_for(subject="Never sent", timeout=1.0)

    assert other.stats()["reserved"] == 2  # the other worker's commit came during the wait
    assert pauses.pauses[:4] == [0.001, 0.002, 0.004, 0.008]


class _Counting(Store):
    """A real store that counts the waiter's looks at ``PRAGMA data_version``, and can let a
    rival run claim a message between the waiter's scan and its own claim."""

    def __init__(self, path: Path, *, rival: bool = False) -> None:
        super().__init__(path)
        self.versions = 0
        self.rival: Outcome | None = None if rival else Outcome(Status.WAITING)

    def data_version(self) -> int:
        self.versions += 1
        return super().data_version()

    def claim(self, **given: Any) -> Outcome:
        if self.rival is None:  # the rival is quicker, once
            self.rival = super().claim(**{**given, "holder": "run-rival", "waiting": None})
        return super().claim(**given)


def _deliver(store: Store, box: Mailbox, subject: str) -> None:
    delivery = Delivery(rcpt=box.address, alias=box.alias, tag=None, domain=box.domain)
    raw = f"To: {box.address}\r\nSubject: {subject}\r\n\r\nhi\r\n".encode()
    store.deliver(
        mail_from="app@app.example.test",
        deliveries=[delivery],
        raw=raw,
        subject=subject,
        run_header=None,
    )


def test_a_look_whose_stop_is_set_ends_after_one_look_though_news_comes(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # The agent's wait_for_message, cut short by its server closing: the look made when
    # ``stop`` is set is the last, whatever arrives during it.
    send(mailbox_server, mail(isolated_mailbox.address, "First"))
    stop = threading.Event()
    stop.set()
    seen: list[str] = []

    def keep(message: Message) -> bool:
        seen.append(message.subject)
        if len(seen) == 1:  # mail arrives while the look is under way
            send(mailbox_server, mail(isolated_mailbox.address, "Late"))
        return message.subject == "Late"

    assert isolated_mailbox.look_for(keep, timeout=600, stop=stop) == []
    assert seen == ["First"]


def test_a_wait_whose_mail_is_there_reads_no_store_version(db: Path) -> None:
    store = _Counting(db)
    try:
        box = Mailbox.reserve(store, contract=EmailContract(), domain="mailbox.test")
        _deliver(store, box, "Already here")

        claimed = box.wait_for(subject="Already here", timeout=10)

        assert claimed.subject == "Already here"  # its bytes came with the claim
        assert store.versions == 0  # no pause point: nothing to pause for
    finally:
        store.close()


def test_a_claim_refused_at_the_first_look_waits_on_from_a_fresh_look(db: Path) -> None:
    store = _Counting(db, rival=True)
    try:
        pauses = _Pauses()
        box = Mailbox.reserve(store, contract=EmailContract(), domain="mailbox.test", signal=pauses)
        _deliver(store, box, "Contested")

        with pytest.raises(WaitTimeout, match="already claimed by run run-rival"):
            box.wait_for(subject="Contested", timeout=SHORT)

        assert store.rival is not None
        assert store.rival.status is Status.CLAIMED
        assert pauses.pauses[:2] == [POLL_FIRST, 2 * POLL_FIRST]
    finally:
        store.close()


# -- the sink refuses other domains ----------------------------------------------------------


def test_recipient_outside_the_test_domains_is_refused_and_nothing_is_stored(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    foreign_domain = f"{isolated_mailbox.alias}.example.com"
    outsider = f"user@{foreign_domain}"

    with (
        smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp,
        pytest.raises(smtplib.SMTPRecipientsRefused) as caught,
    ):
        smtp.send_message(mail(outsider))

    code, text = caught.value.recipients[outsider]
    assert code == 550
    assert b"5.7.1" in text
    assert foreign_domain.encode() in text
    assert mailbox_store.unrouted(foreign_domain) == []
    assert ids(mailbox_store, isolated_mailbox) == []


def test_mixed_recipients_deliver_only_to_the_test_domain(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    foreign_domain = f"{isolated_mailbox.alias}.example.com"
    outsider = f"user@{foreign_domain}"

    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        refused = smtp.send_message(
            mail(isolated_mailbox.address), to_addrs=[outsider, isolated_mailbox.address]
        )

    assert list(refused) == [outsider]
    assert refused[outsider][0] == 550
    assert mailbox_store.unrouted(foreign_domain) == []
    msg = isolated_mailbox.wait_for(subject="Welcome", timeout=10)
    assert msg.envelope_to == isolated_mailbox.address
    assert ids(mailbox_store, isolated_mailbox) == [msg.message_id]


# -- selectors -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("selector", "field"),
    [
        pytest.param({"subject_regex": "(unclosed"}, "subject_regex", id="invalid-subject-regex"),
        pytest.param({"body_regex": "[a-"}, "body_regex", id="invalid-body-regex"),
        pytest.param({"subjekt": "Welcome"}, "subjekt", id="unknown-field"),
        pytest.param({"header": ("X-Run-Id\r\nBcc", "x")}, "header", id="header-name-crlf"),
        pytest.param({"header": ("X-Run-Id\n", "x")}, "header", id="header-name-lf"),
    ],
)
def test_invalid_selector_raises_contract_error_naming_the_field(
    isolated_mailbox: Mailbox, selector: dict[str, Any], field: str
) -> None:
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.wait_for(timeout=10, **selector)

    text = str(caught.value)
    assert text.startswith((f"selector: {field}=", f"selector: unknown field {field!r}"))
    assert caught.value.result["status"] == "policy_denied"
    with pytest.raises(ContractError, match=f"selector: .*{field}"):
        isolated_mailbox.expect_none(within=SHORT, **selector)


def test_every_selector_field_is_described_for_its_refusals() -> None:
    # the list a refusal names, and what each field allows: one per field, in its order
    assert list(SELECTOR_FIELDS) == list(Selector.model_fields)


def test_unknown_selector_field_lists_the_allowed_fields(isolated_mailbox: Mailbox) -> None:
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.wait_for(subjekt="Welcome", timeout=10)

    assert str(caught.value) == (
        "selector: unknown field 'subjekt'; allowed fields: subject, subject_contains, "
        "subject_regex, sender, header, tag, body_contains, body_regex, received_after; "
        "wait_for's own arguments: timeout, lease"
    )


def _blocking_or_awaited(
    wait: str, blocking: Callable[..., Any], awaited: Callable[..., Any]
) -> Callable[..., None]:
    """The call itself (``wait="sync"``), or its async twin run to its end."""

    def call(**given: Any) -> None:
        if wait == "sync":
            blocking(**given)
        else:
            asyncio.run(awaited(**given))

    return call


@pytest.mark.parametrize("wait", ["sync", "async"])
def test_a_misspelt_argument_of_a_wait_is_told_the_wait_s_own(
    isolated_mailbox: Mailbox, wait: str
) -> None:
    wait_for = _blocking_or_awaited(
        wait, isolated_mailbox.wait_for, isolated_mailbox.wait_for_async
    )

    # timout= went into the selector, whose refusal listed the fields but not timeout
    with pytest.raises(ContractError) as caught:
        wait_for(subject_contains="x", timout=0.1)

    assert str(caught.value).startswith("selector: unknown field 'timout'; allowed fields: ")
    assert str(caught.value).endswith("; wait_for's own arguments: timeout, lease")


@pytest.mark.parametrize("wait", ["sync", "async"])
def test_a_positional_argument_of_a_wait_is_told_the_keywords(
    isolated_mailbox: Mailbox, wait: str
) -> None:
    # wait_for("Verify") was a bare TypeError: "takes 1 positional argument but 2 were given"
    box = isolated_mailbox
    examples = {
        (box.wait_for, box.wait_for_async): (
            "wait_for(subject='Verify your address') or wait_for(subject_contains='Verify')"
        ),
        (box.expect_none, box.expect_none_async): (
            "expect_none(within=2, subject_contains='Verify')"
        ),
    }
    for (blocking, awaited), example in examples.items():

        def call(blocking: Any = blocking, awaited: Any = awaited) -> None:
            if wait == "sync":
                blocking("Verify 415926")
            else:
                asyncio.run(awaited("Verify 415926"))

        with pytest.raises(ContractError) as caught:
            call()
        text = str(caught.value)
        name = example.split("(")[0]
        assert text.startswith(f"{name} takes keyword arguments only, e.g. {example}; ")
        assert "allowed fields: subject, subject_contains, " in text
        assert "415926" not in text  # the value given is not quoted: it may be a code
        assert caught.value.result["status"] == "policy_denied"


@pytest.mark.parametrize("wait", ["sync", "async"])
def test_expect_none_given_timeout_or_nothing_says_within(
    isolated_mailbox: Mailbox, wait: str
) -> None:
    expect_none = _blocking_or_awaited(
        wait, isolated_mailbox.expect_none, isolated_mailbox.expect_none_async
    )

    # timeout=, as wait_for takes it: a bare TypeError about 'within' before
    with pytest.raises(ContractError) as caught:
        expect_none(timeout=0.1, subject_contains="x")
    assert str(caught.value).startswith("selector: unknown field 'timeout'; ")
    assert str(caught.value).endswith("; expect_none's own argument: within")

    with pytest.raises(ContractError) as caught:
        expect_none(subject_contains="x")
    assert str(caught.value) == (
        "expect_none: within= is required: the seconds in which no match may arrive"
    )


def test_header_name_with_line_break_is_refused_with_the_rule(isolated_mailbox: Mailbox) -> None:
    with pytest.raises(ContractError) as caught:
        isolated_mailbox.wait_for(header=("X-Run-Id\r\nBcc", "x"), timeout=10)

    text = str(caught.value)
    assert text.startswith("selector: header=('X-Run-Id\\r\\nBcc', 'x') is invalid")
    assert "without ':', spaces or line breaks" in text


ALPHA = {
    "subject": "Welcome aboard",
    "sender": "Alpha <alpha@app.example.test>",
    "text": "Hello alpha, your code is 111111.\n",
    "html": "<p>Hello alpha</p>",
    "headers": {"X-Campaign": "alpha"},
}
BETA = {
    "subject": "Welcome back",
    "sender": "Beta <beta@app.example.test>",
    "text": "Hello beta, your code is 222222.\n",
    "html": "<p>Hello <b>beta-only-in-html</b></p>",
    "headers": {"X-Campaign": "beta"},
}


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        pytest.param({"subject": "Welcome aboard"}, ALPHA, id="subject-exact"),
        pytest.param({"subject_contains": "back"}, BETA, id="subject-contains"),
        pytest.param({"subject_regex": r"^Welcome a"}, ALPHA, id="subject-regex"),
        pytest.param({"sender": "BETA@app.example.test"}, BETA, id="sender"),
        pytest.param({"header": ("x-campaign", "alpha")}, ALPHA, id="header"),
        pytest.param({"body_contains": "Hello beta"}, BETA, id="body-contains"),
        pytest.param({"body_contains": "beta-only-in-html"}, BETA, id="body-contains-html"),
        pytest.param({"body_regex": r"alpha, your code is \d{6}"}, ALPHA, id="body-regex"),
    ],
)
def test_selector_picks_the_right_one_of_two(
    mailbox_server: MailSink,
    isolated_mailbox: Mailbox,
    selector: dict[str, Any],
    expected: dict[str, Any],
) -> None:
    for fields in (ALPHA, BETA):
        send(mailbox_server, mail(isolated_mailbox.address, **fields))
    with pytest.raises(AmbiguousMatch):  # both are candidates without the selector
        isolated_mailbox.wait_for(subject_contains="Welcome", timeout=10)

    msg = isolated_mailbox.wait_for(timeout=10, **selector)

    assert msg.subject == expected["subject"]
    assert msg.header("X-Campaign") == expected["headers"]["X-Campaign"]


def py311(pattern: str) -> Any:
    """Atomic groups and possessive repeats are Python 3.11's ``re`` syntax: Python 3.10
    refuses them as not a regular expression (tested below)."""
    return pytest.param(
        pattern,
        marks=pytest.mark.skipif(sys.version_info < (3, 11), reason="Python 3.11 re syntax"),
    )


#: Repeated groups that can read a text in more than one way, round after round, though
#: no repeat nests in another: a failing search on a long message runs for hours.
AMBIGUOUS_ROUNDS = [
    r"(a|aa)+$",  # the first review's case: 1.3 s on 33 characters
    r"(aa?)+$",  # a round's optional end may begin the next round
    r"(a?a)+$",  # and an optional start may take the previous round's end
    r"Hello,(?:\s*\n)+Your code",  # 9.4 s with 27 blank lines
    r"(\d*\d)+x",
    r"(\d|\d\d)+$",
    r"(b|ba|a)+$",  # "ba" is one round or two
    r"(?:(?:a)|(?:a))+$",  # two alternatives take the same text
    r"(?:a{2}|a{3})+$",
    r"(?:[а-я]|[а-я]{2})+$",  # characters outside ASCII
    r"(?i:a|Aa)+$",  # flags of a group
    r"(?i)(?:x|yX?)+$",
    r"(?:(?:a|aa){8}){4}$",  # few rounds each, 32 in all
    py311(r"(?>(?:a|aa)+b)"),  # inside an atomic group
    py311(r"(?:(?>\w)|x)+$"),
    r"(?:(?:(?=a))+a)+!",  # a lookahead repeated: nothing taken, two ways
    r"(a)(?:\1|b)+$",  # a backreference may take anything
    r"Dear ((?:[\w-]{1,30} ?){1,8}),",  # few rounds, but each may end in 30 places
    r"(?:\r\n|\n|\r)+Z",  # "\r\n" is one round or two
    r"(\w?\w?\w?\w?){1,8}!",  # > 8 s on 12 characters
    # Few ways each, too many together: the readings of parts in a row multiply.
    r"(?:\s|\s\s){8}(?:\s|\s\s){8}(?:\s|\s\s){8}(?:\s|\s\s){8}x",  # 2**32: 1.2 s on 34 spaces
    r"(?:\s|\s\s){8}x(?:\s|\s\s){8}x(?:\s|\s\s){8}x(?:\s|\s\s){8}!",  # apart, still 2**32
    r"(?:\d{1,3},?){1,4}(?:\d{1,3},?){1,4}(?:\d{1,3},?){1,4}x",  # 3**12: 3.7 s on 39 digits
    r"\s?" * 24 + "x",  # 2**23: 5.8 s on 23 spaces
    r"(?:a|a|a|a){16}x",  # alternatives that read the same text: 4**16, minutes
    r"(?:(?:\w|[^x]){2,5}){1,8}!",  # \w and [^x] both read "a": minutes on 19 of them
]
#: Repeated groups that read a text one way only, or whose repeat cannot give back.
ONE_WAY_ROUNDS = [
    r"(\w+\.)+example\.test",  # each round ends in a part the next cannot begin with
    r"(?:[A-Z0-9]{4}-?)+",
    r"(a|ab)+c",
    r"(ab?)+$",
    r"(?:\s|&nbsp;)+code",
    r'(?:\\.|[^"\\])*',
    r"(?:\s*(?:<br>|<br/>|</p>))*\s*Thanks",  # alternatives that share a start
    r"(?:, (?:alice|anna|bob))+ joined",
    r"[\w-]+(?:\.(?:com|co|org))+",
    py311(r"(?:a++|b)+$"),  # possessive: never gives back
    py311(r"(?>a|ab)+$"),  # atomic
    py311(r"(?>a+)+!"),  # an atomic round is not split again, whatever it holds
    py311(r"(?>\w+\s?)+$"),
    r"(?:(?=a)a|b)+$",
    r"(\d\d?){3}",  # few rounds: bounded
    r"Hello,(?:\r?\n|<br>)+Your code",  # alternatives that begin apart
    r"(?:=(?:\r?\n|[0-9A-F]{2})|[^=\s])+",  # quoted-printable: soft break, =XX, a character
    r"(?:-?\d|x)+",
    r"(?m)(?:^> .*$\n?)+",  # quoted reply lines: past "$" only the line break comes
    r"(?:\d{1,3},?){1,4}",  # few rounds, each ending in few places: few ways in all
    r"(?:\d{1,3}[ .-]?){3,4}",
    r"Dear (\w{2,20} ?){1,3},",
    # Parts in a row whose readings, multiplied, stay few.
    r"(?:\d{1,3},?){1,4}(?:\d{1,3},?){1,4}",  # 3**4 * 3**4
    r"(?:\s|\s\s){8}(?:\s|\s\s){8}x",  # 2**16, the most taken
    r"\s?" * 16 + "x",
    r"\d{3}-\d{3}",
    r"[A-Z]{2}\d{6}",
    r"(?:\w+\s){1,5}code",
    r"\+?\d{1,3}[\s.-]?\(?\d{1,4}\)?[\s.-]?\d{1,4}[\s.-]?\d{1,9}",  # a phone number
    r"(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)\w* \d{1,2}, \d{4}",
    r"(?:https?://)?(?:www\.)?[\w.-]+\.\w{2,}(?:/[\w./?%&=-]*)?",
    r"(?:\d{1,3}\.){3}\d{1,3}",
]


@pytest.mark.parametrize("pattern", [r"(?>a|ab)+$", r"(?:a++|b)+$"])
def test_atomic_groups_and_possessive_repeats_are_taken_where_python_reads_them(
    isolated_mailbox: Mailbox, pattern: str
) -> None:
    """A selector's regex is Python's: these are ``re`` syntax from Python 3.11, and on
    Python 3.10 the selector is refused naming why, before any wait."""
    if sys.version_info >= (3, 11):
        isolated_mailbox.expect_none(within=0, subject_regex=pattern)
    else:
        with pytest.raises(ContractError, match=r"is invalid: .*not a valid regular expression"):
            isolated_mailbox.expect_none(within=0, subject_regex=pattern)


@pytest.mark.parametrize("pattern", AMBIGUOUS_ROUNDS)
def test_a_regex_whose_rounds_split_many_ways_is_refused(
    isolated_mailbox: Mailbox, pattern: str
) -> None:
    for field in ("subject_regex", "body_regex"):
        with pytest.raises(ContractError, match="can read a text in more than one way"):
            isolated_mailbox.wait_for(timeout=10, **{field: pattern})


@pytest.mark.parametrize("pattern", ONE_WAY_ROUNDS)
def test_a_regex_whose_rounds_split_one_way_is_taken(
    isolated_mailbox: Mailbox, pattern: str
) -> None:
    isolated_mailbox.expect_none(within=0, subject_regex=pattern, body_regex=pattern)


def test_a_regex_whose_parts_split_too_many_ways_together_is_refused_with_the_count(
    isolated_mailbox: Mailbox,
) -> None:
    """Each group alone is taken (256 ways); four in a row are refused, and say why."""
    group = r"(?:\s|\s\s){8}"
    isolated_mailbox.expect_none(within=0, body_regex=group + "x")

    with pytest.raises(ContractError) as caught:
        isolated_mailbox.wait_for(timeout=10, body_regex=group * 4 + "x")

    assert "together they can read one in more than 65,536 ways" in str(caught.value)


def test_a_search_that_backtracks_on_the_mail_is_stopped_and_refused(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Polynomial backtracking passes the static check: this pattern takes minutes on
    29 KB of table cells with ``re``. The search is stopped, and the selector refused."""
    cells = "<td>x</td>" * 2900
    send(mailbox_server, mail(isolated_mailbox.address, "Cells", text=cells, html=cells))
    slow = r"<td.*>.*Code.*:.*(\d{6})"

    with pytest.raises(ContractError) as waited:
        isolated_mailbox.wait_for(body_regex=slow, timeout=60)
    message = isolated_mailbox.wait_for(subject="Cells", timeout=5)
    with pytest.raises(ExtractionError) as extracted:
        message.code(pattern=slow)

    assert str(waited.value).startswith(
        "selector: body_regex='<td.*>.*Code.*:.*(\\\\d{6})' took more than 1s on a text of "
    )
    assert "[^>]* instead of .*" in str(waited.value)
    assert waited.value.result["field"] == "body_regex"
    assert str(extracted.value).startswith(
        'code(pattern=r"<td.*>.*Code.*:.*(\\d{6})") took more than 1s on a text of 29,'
    )


def test_a_stopped_search_masks_a_code_its_pattern_holds(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    cells = "<td>x</td>" * 2900
    send(mailbox_server, mail(isolated_mailbox.address, "Cells", text=cells, html=cells))

    with pytest.raises(ContractError) as waited:
        isolated_mailbox.wait_for(body_regex=r"<td.*>.*Code.*:.*482913", timeout=60)

    assert "482913" not in str(waited.value)
    assert str(waited.value).startswith("selector: body_regex='<td.*>.*Code.*:.*••••13' took")


def test_sender_selector_also_matches_the_envelope_sender(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    for bounce, subject in (("bounce-a@app.example.test", "A"), ("bounce-b@app.example.test", "B")):
        raw = mail(isolated_mailbox.address, subject).as_bytes()
        with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
            smtp.sendmail(bounce, [isolated_mailbox.address], raw)

    msg = isolated_mailbox.wait_for(sender="bounce-b@app.example.test", timeout=10)

    assert (msg.subject, msg.envelope_from) == ("B", "bounce-b@app.example.test")


# -- claim and ack ---------------------------------------------------------------------------


def test_wait_for_claims_and_ack_consumes(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))

    msg = isolated_mailbox.wait_for(subject="Welcome", timeout=10)

    claimed = mailbox_store.message(msg.message_id)
    assert claimed is not None
    assert (claimed.state, claimed.fence, claimed.holder) == (
        "claimed",
        msg.fence,
        isolated_mailbox.run_id,
    )
    assert msg.fence > isolated_mailbox.fence
    assert msg.lease_until is not None

    msg.ack()

    consumed = mailbox_store.message(msg.message_id)
    assert consumed is not None
    assert (consumed.state, consumed.fence) == ("consumed", msg.fence)
    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)
    assert (
        f"  - {msg.message_id} 'Welcome': already consumed (fence {msg.fence})"
        in str(caught.value).splitlines()
    )


def test_a_claim_given_back_is_claimed_again_under_a_new_fence(
    mailbox_server: MailSink, mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    first = isolated_mailbox.wait_for(subject="Welcome", timeout=10)

    first.release()

    assert mailbox_store.message(first.message_id).state == "waiting"  # type: ignore[union-attr]
    again = isolated_mailbox.wait_for(subject="Welcome", timeout=10)
    assert again.message_id == first.message_id
    assert again.fence > first.fence
    again.ack()


def test_a_wait_repeated_for_a_message_this_run_holds_says_it_is_in_hand(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    msg = isolated_mailbox.wait_for(subject="Welcome", timeout=10)

    with pytest.raises(WaitTimeout) as caught:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)  # a retried step
    assert (
        f"  - {msg.message_id} 'Welcome': already claimed by this run (fence {msg.fence}): "
        "its holder (a ClaimedMessage of the test, or the agent's claim) acks or releases it"
    ) in str(caught.value).splitlines()
    with pytest.raises(WaitTimeout) as other:  # not this wait's message anyway: that is why
        isolated_mailbox.wait_for(subject="Your receipt", timeout=SHORT)
    assert (f"  - {msg.message_id} 'Welcome': subject is not 'Your receipt'") in str(
        other.value
    ).splitlines()


@pytest.mark.email_contract(ttl=30)
@pytest.mark.parametrize("waits", ["blocking", "awaiting"])
def test_a_wait_takes_its_message_once_the_lease_that_held_it_ends(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, waits: str
) -> None:
    """Nothing is committed when a lease ends (a holder that crashed or gave up): the
    waiter looks again then. Before, it slept until its deadline, here past the mailbox's
    ttl, so the mailbox expired under it."""
    send(mailbox_server, mail(isolated_mailbox.address))
    held = isolated_mailbox.wait_for(subject="Welcome", timeout=10, lease=0.3)  # never acked

    if waits == "blocking":
        again = isolated_mailbox.wait_for(subject="Welcome", timeout=60)
    else:
        again = asyncio.run(isolated_mailbox.wait_for_async(subject="Welcome", timeout=60))

    assert (again.message_id, again.fence > held.fence) == (held.message_id, True)
    again.ack()
    assert isolated_mailbox.state == "consumed"


@pytest.mark.email_contract(run_header="X-Test-Run")
def test_run_header_named_by_the_contract_is_the_one_checked(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """Another run's X-Test-Run is refused; an unrelated X-Run-Id of the app's is ignored."""
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, "Verify", headers={"X-Test-Run": "r-someoneelse"}))
    send(mailbox_server, mail(to, "Verify", headers={"X-Run-Id": "req-123"}))

    msg = isolated_mailbox.wait_for(subject="Verify", timeout=5)

    assert msg.header("X-Run-Id") == "req-123"
    with pytest.raises(WaitTimeout, match="X-Test-Run belongs to run r-someoneelse"):
        isolated_mailbox.wait_for(subject="Verify", timeout=0.1)


def test_near_misses_mask_an_extracted_secret_in_a_subject(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, "Your word is quokkaplum"))
    msg = isolated_mailbox.wait_for(timeout=5)
    assert msg.code(pattern=r"is (\w+)") == "quokkaplum"

    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(subject="Other", timeout=0.1)

    assert "quokkaplum" not in str(info.value)
    assert "'Your word is ••••••••um'" in str(info.value)


def test_near_miss_reasons_mask_the_digits_a_selector_looked_for(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # A test may wait for the code it was given; the reason quotes it masked, as the
    # first line of the error and the receipt's timeline do.
    send(mailbox_server, mail(isolated_mailbox.address, "Your code", headers={"X-Code": "1"}))

    for selector, reason in [
        ({"subject_contains": "code 415926"}, "subject does not contain 'code ••••26'"),
        ({"subject": "415926"}, "subject is not '••••26'"),
        ({"subject_regex": "code 415926$"}, "subject does not match /code ••••26$/"),
        ({"body_contains": "415926"}, "body does not contain '••••26'"),
        ({"body_regex": "415926"}, "body does not match /••••26/"),
        ({"header": ("X-Code", "415926")}, "header X-Code is not '••••26'"),
    ]:
        with pytest.raises(WaitTimeout) as info:
            isolated_mailbox.wait_for(timeout=0.1, **selector)
        assert "415926" not in str(info.value)
        assert f"'Your code': {reason}" in str(info.value)


def test_a_near_miss_reason_masks_a_code_a_line_break_in_the_selector_runs_into(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # Quoted, "code:\nA7K9Q2" reads "code:\\nA7K9Q2": the word "nA7K9Q2" looks like no
    # code, so the value is masked as written before it is quoted.
    send(mailbox_server, mail(isolated_mailbox.address, "Your code"))

    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(body_contains="code:\nA7K9Q2", timeout=0.1)

    assert "A7K9Q2" not in str(info.value)
    assert "'Your code': body does not contain 'code:\\n••••Q2'" in str(info.value)


def test_errors_mask_an_extracted_code_a_selector_looks_for(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # The code is letters (no digit run to mask): only its recorded digest can hide it.
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, "Your code", text="Your code is QXKZTRWB\n"))
    code = isolated_mailbox.wait_for(timeout=5).code(pattern=r"code is (\w+)")
    assert code == "QXKZTRWB"
    send(mailbox_server, mail(to, "Reminder", text="Still waiting\n"))
    send(mailbox_server, mail(to, "Reminder", text="Still waiting\n"))

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(body_contains=code, timeout=0.1)
    with pytest.raises(AmbiguousMatch) as ambiguous:
        isolated_mailbox.wait_for(subject_regex=f"Reminder|{code}", timeout=0.1)
    with pytest.raises(UnexpectedMessage) as unexpected:
        isolated_mailbox.expect_none(within=0, subject_regex=f"Remind|{code}")

    for caught in (timed_out, ambiguous, unexpected):
        assert "QXKZTRWB" not in str(caught.value)
        assert "••••••WB" in str(caught.value)
    assert "body does not contain '••••••WB'" in str(timed_out.value)


def test_errors_redact_links_tokens_and_codes_in_subjects_nobody_extracted(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # Nothing was extracted: no digest or memory masks these, only what they look like.
    token = "Hq3mV8sLx2Rt7Wk9Pz4N"
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, f"Sign in: https://app.example.test/verify?token={token}"))
    send(mailbox_server, mail(to, f"Your magic token {token}"))
    send(mailbox_server, mail(to, "認証コードはA7K9Q2です"))

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(subject="Welcome", timeout=0.1)
    with pytest.raises(AmbiguousMatch) as ambiguous:
        isolated_mailbox.wait_for(timeout=0.1)
    with pytest.raises(UnexpectedMessage) as unexpected:
        isolated_mailbox.expect_none(within=0, subject_contains="Sign in")

    for caught in (timed_out, ambiguous, unexpected):
        assert token not in str(caught.value)
        assert "A7K9Q2" not in str(caught.value)
    shown = [
        "'Sign in: https://app.example.test/…?token=…'",
        "'Your magic token ••••••••••••••••••4N'",
        "'認証コードは••••Q2です'",
    ]
    for subject in shown:
        assert subject in str(timed_out.value)
        assert subject in str(ambiguous.value)
    assert shown[0] in str(unexpected.value)


def test_the_receipt_masks_what_the_run_extracted_inside_a_word_and_a_link_whole(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    link = "https://app.example.test/verify?token=Wm4Kx9Rq2Lp7Tz3V"
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, f"Sign in: {link}", text=f"Open {link}\n"))
    send(mailbox_server, mail(to, "認証コードはQXKZTRです", text="コード: QXKZTR\n"))
    send(mailbox_server, mail(to, "Login code_PLMQWZ", text="code_PLMQWZ\n"))
    assert isolated_mailbox.wait_for(subject_contains="Sign in", timeout=5).link() == link
    glued = isolated_mailbox.wait_for(subject_contains="認証", timeout=5)
    assert glued.code(pattern=r"コード: (\w+)") == "QXKZTR"
    underscored = isolated_mailbox.wait_for(subject_contains="Login", timeout=5)
    assert underscored.code(pattern=r"code_(\w+)") == "PLMQWZ"

    receipt = isolated_mailbox.receipt()

    for secret in ("Wm4Kx9Rq2Lp7Tz3V", "QXKZTR", "PLMQWZ"):
        assert secret not in dump_receipt(receipt)
    assert [m.subject for m in receipt.messages] == [
        "Sign in: https://app.example.test/…?token=…",
        "認証コードは••••TRです",
        "Login code_••••WZ",
    ]
    assert "QXKZTR" not in repr(glued)


def test_a_near_miss_masks_a_token_in_the_senders_address(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    token = "Kx7pQ2mZr9TbW4nYv8Ls"
    sender = f"reply+{token}@app.example.test"
    send(mailbox_server, mail(isolated_mailbox.address, "Reply to comment", sender=sender))

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(sender="support@app.example.test", timeout=0.01)

    assert token not in str(timed_out.value)
    assert "sender reply+••••••••••••••••••Ls@app.example.test is not" in str(timed_out.value)


def test_a_near_miss_escapes_a_direction_override_in_the_senders_address(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """A sender taken with SMTPUTF8 may hold a right-to-left override (U+202E): a
    timeout's near miss printed it as it is, and the terminal reordered the line."""
    sender = "no\u202ereply@app.example.test"
    raw = f"From: {sender}\r\nTo: {isolated_mailbox.address}\r\nSubject: Hi\r\n\r\nx\r\n"
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.ehlo()
        smtp.sendmail(sender, [isolated_mailbox.address], raw.encode(), ["SMTPUTF8"])

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(sender="support@app.example.test", timeout=0.01)

    assert "sender no\\u202ereply@app.example.test is not" in str(timed_out.value)
    assert "\u202e" not in str(timed_out.value)


@pytest.mark.parametrize("where", ["look-alike", "earlier run"])
def test_a_near_miss_escapes_a_direction_override_in_the_envelope_recipient(
    mailbox_server: MailSink,
    mailbox_store: Store,
    email_contract: EmailContract,
    request: pytest.FixtureRequest,
    where: str,
) -> None:
    """An envelope recipient's tag taken with SMTPUTF8 may hold a right-to-left override:
    the near miss of mail for a look-alike alias, or for an earlier attempt's closed
    mailbox of this test (a rerun's), printed it as it is, and the terminal reordered the
    line."""
    first = _reserved(mailbox_store, email_contract, request.node.nodeid)
    first.close(success=False)
    rerun = _reserved(mailbox_store, email_contract, request.node.nodeid)
    alias = first.alias if where == "earlier run" else rerun.alias + "x"
    rcpt = f"{alias}+ab\u202ecd@{rerun.domain}"
    _send_utf8(mailbox_server, rcpt)

    with pytest.raises(WaitTimeout) as timed_out:
        rerun.wait_for(subject="Welcome", timeout=0.01)
    rerun.close(success=False)

    shown = " is not" if where == "look-alike" else ", the address of an earlier run"
    assert f"{alias}+ab\\u202ecd@{rerun.domain}{shown}" in str(timed_out.value)
    assert "\u202e" not in str(timed_out.value)


def test_a_near_miss_names_no_mailbox_the_same_attempt_closed_as_an_earlier_runs(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, second_mailbox: Mailbox
) -> None:
    """Another mailbox of the same test, closed as the test went on, is no earlier run's:
    mail for it after it closed was named ``the address of an earlier run of this test``,
    and the app said to have kept that run's address."""
    second_mailbox.close(success=True)
    _send_utf8(mailbox_server, second_mailbox.address)

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(subject="Welcome", timeout=0.01)

    assert "earlier run" not in str(timed_out.value)
    assert "no mail arrived for this mailbox" in str(timed_out.value)


def _reserved(store: Store, contract: EmailContract, nodeid: str) -> Mailbox:
    return Mailbox.reserve(store, contract=contract, domain="mailbox.test", nodeid=nodeid)


def _send_utf8(server: MailSink, rcpt: str) -> None:
    raw = f"From: a@app.example.test\r\nTo: {rcpt}\r\nSubject: Hi\r\n\r\nx\r\n"
    with smtplib.SMTP(server.host, server.port) as smtp:
        smtp.ehlo()
        smtp.sendmail("a@app.example.test", [rcpt], raw.encode(), ["SMTPUTF8"])


def test_the_receipt_masks_a_code_the_test_took_from_another_mailbox(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, second_mailbox: Mailbox
) -> None:
    # One mail to both: the test reads the code in one mailbox, the other shows its subject.
    both = [second_mailbox.address, isolated_mailbox.address]
    message = mail(second_mailbox.address, "Your sign-in code: QXKZTR", text="コード: QXKZTR\n")
    send(mailbox_server, message, to=both)
    taken = second_mailbox.wait_for(timeout=5)
    assert taken.code(pattern=r"コード: ([A-Z]{6})") == "QXKZTR"
    isolated_mailbox.wait_for(timeout=5).ack()

    receipt = isolated_mailbox.receipt()

    assert [m.subject for m in receipt.messages] == ["Your sign-in code: ••••TR"]


def test_errors_and_the_timeline_mask_an_extracted_secret_inside_a_pattern_or_a_link(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, second_mailbox: Mailbox
) -> None:
    link = "https://app.example.test/verify?t=Zk3Pq9Wm2Lx"
    send(mailbox_server, mail(isolated_mailbox.address, "Invite", text=f"{link} QXKZTR\n"))
    message = isolated_mailbox.wait_for(timeout=5)
    code, found = message.code(pattern=r"(QX\w+)"), message.link()
    assert (code, found) == ("QXKZTR", link)

    caught = []
    for box, selector in [
        (isolated_mailbox, {"body_regex": rf"\b{code}\b"}),  # glued to the pattern's \b
        (isolated_mailbox, {"body_contains": link}),  # a link is no single word
        (second_mailbox, {"body_contains": code}),  # another mailbox waits for it
    ]:
        with pytest.raises(WaitTimeout) as timed_out:
            box.wait_for(timeout=0.01, **selector)
        caught.append(str(timed_out.value))
    receipt = dump_receipt(second_mailbox.receipt())

    token = found.rsplit("=", 1)[1]  # a token taken out of the link
    with pytest.raises(WaitTimeout) as by_token:
        isolated_mailbox.wait_for(timeout=0.01, body_contains=token)
    caught.append(str(by_token.value))

    for text in [*caught, receipt]:
        assert "QXKZTR" not in text
        assert "Zk3Pq9Wm2Lx" not in text
    assert "body_contains='••••TR'" in receipt  # the waiting step, as the store keeps it


def test_a_timeout_with_no_mail_at_all_asks_where_the_app_sends(
    isolated_mailbox: Mailbox,
) -> None:
    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(subject="Welcome", timeout=SHORT)

    first, second = str(timed_out.value).splitlines()
    assert first.startswith(f"no message for {isolated_mailbox.address} matched subject=")
    assert second == (
        "no mail arrived for this mailbox or an unknown alias like it: is the app "
        "sending to the sink (mailbox_server.host and .port, or .settings) and to this "
        "address? A framework's test set-up may swap in a backend that sends nothing "
        "(Django's locmem, Flask-Mail's MAIL_SUPPRESS_SEND): see Recipes"
    )


def test_errors_and_the_timeline_mask_a_token_the_test_got_from_its_app(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    token = "HTOnEmKT6XHqx8eV6XLjCg"  # secrets.token_urlsafe(16), never extracted here
    link = f"https://app.example.test/verify?token={token}&next=home"
    send(mailbox_server, mail(isolated_mailbox.address, "Verify", text=f"Open {link}\n"))

    caught = []
    for selector in [
        {"body_contains": token, "subject": "Other"},
        {"body_contains": link + "x"},  # one character off: a near miss that quotes it
        {"body_regex": re.escape(link) + "x"},
        {"body_contains": "550e8400-e29b-41d4-a716-446655440000"},  # a UUID as token
    ]:
        with pytest.raises(WaitTimeout) as timed_out:
            isolated_mailbox.wait_for(timeout=0.01, **selector)
        caught.append(str(timed_out.value))
    receipt = dump_receipt(isolated_mailbox.receipt())

    for text in [*caught, receipt]:
        assert token not in text
        assert "446655440000" not in text
    assert "body_contains='••••••••••••••••••••Cg'" in receipt
    assert "body does not contain 'https://app.example.test/…?token=…&next=…'" in caught[1]
    assert "subject is not 'Other'" in caught[0]  # words stay readable
    assert f"run {isolated_mailbox.run_id}" in caught[0]  # so do the plugin's ids


def test_a_short_code_is_masked_in_its_own_mailboxs_errors(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, "PIN", text="PIN: A7X\n"))
    code = isolated_mailbox.wait_for(timeout=5).code(pattern=r"PIN: (\w+)")
    assert code == "A7X"

    with pytest.raises(WaitTimeout) as timed_out:
        isolated_mailbox.wait_for(timeout=0.01, body_regex=rf"\b{code}\b")

    assert "A7X" not in str(timed_out.value)


def test_near_miss_sender_reasons_mask_digit_runs(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address, sender="noreply+4815162342@app.test"))

    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(sender="user-9876543210@app.test", timeout=0.1)

    assert "4815162342" not in str(info.value)
    assert "9876543210" not in str(info.value)
    assert "sender noreply+••••••••42@app.test is not user-••••••••10@app.test" in str(info.value)


def test_a_near_miss_masks_a_token_in_a_sender_selectors_domain(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    # A selector's sender is masked as anything a test copied is, not only as an address
    # shows it: a token as a host name (a per-message bounce domain) too.
    send(mailbox_server, mail(isolated_mailbox.address))

    with pytest.raises(WaitTimeout) as info:
        isolated_mailbox.wait_for(sender="bounce@3f9a1c07be52d8e4.app.test", timeout=0.1)

    assert "3f9a1c07be52d8e4" not in str(info.value)
    assert "is not bounce@••••••••••••••e4.app.test" in str(info.value)


def test_a_body_regex_finds_what_only_the_html_part_says(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    message = mail(isolated_mailbox.address, text="Open the link.\n", html="<p>Press Confirm</p>")
    send(mailbox_server, message)

    assert isolated_mailbox.wait_for(body_regex=r"Press\s+Confirm", timeout=10).subject == "Welcome"


# -- a claim is acted on by its own mailbox only ---------------------------------------------


def test_a_mailbox_cannot_ack_renew_or_give_back_another_runs_message(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, second_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(second_mailbox.address))
    theirs = second_mailbox.wait_for(subject="Welcome", timeout=10)
    isolated_mailbox.release()  # released or not, it is not the mailbox of that message

    for act in (
        lambda: isolated_mailbox.ack(theirs.message_id, theirs.fence),
        lambda: isolated_mailbox.renew(theirs.message_id, theirs.fence, 30),
        lambda: isolated_mailbox.release_claim(theirs.message_id, theirs.fence),
    ):
        with pytest.raises(MailboxClosed, match="not in this mailbox") as refused:
            act()
        assert refused.value.status is Status.POLICY_DENIED

    theirs.ack()  # its own holder was never disturbed
    (row,) = second_mailbox.store.messages(second_mailbox.mailbox_id)
    assert (row.state, row.fence) == ("consumed", theirs.fence)


@pytest.mark.parametrize(
    ("call", "field", "value", "allowed"),
    [
        ("wait_for", "lease", 0, "seconds > 0"),
        ("wait_for", "lease", -5, "seconds > 0"),
        ("wait_for", "lease", float("nan"), "seconds > 0"),
        ("wait_for", "timeout", float("nan"), "seconds >= 0"),
        ("wait_for", "timeout", -1, "seconds >= 0"),
        ("wait_for", "timeout", True, "seconds >= 0"),
        ("expect_none", "within", float("inf"), "seconds >= 0"),
        ("renew", "lease", -100, "seconds > 0"),
        ("claim", "lease", "30", "seconds > 0"),
        ("claim", "lease", 10**400, "seconds > 0"),  # an int past any float
        ("wait_for", "timeout", 10**400, "seconds >= 0"),
    ],
)
def test_a_bad_duration_for_one_call_is_refused_naming_it(
    mailbox_server: MailSink,
    mailbox_store: Store,
    isolated_mailbox: Mailbox,
    call: str,
    field: str,
    value: object,
    allowed: str,
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    (message_id,) = ids(mailbox_store, isolated_mailbox)
    before = mailbox_store.messages(isolated_mailbox.mailbox_id)
    run: dict[str, Callable[[], object]] = {
        "wait_for": lambda: isolated_mailbox.wait_for(subject="Welcome", **{field: value}),
        "expect_none": lambda: isolated_mailbox.expect_none(within=value, subject="Other"),  # type: ignore[arg-type]
        "renew": lambda: isolated_mailbox.renew(message_id, 1, value),  # type: ignore[arg-type]
        "claim": lambda: isolated_mailbox.claim(message_id, lease=value),  # type: ignore[arg-type]
    }

    with pytest.raises(ContractError) as refused:
        run[call]()

    assert str(refused.value) == (
        f"{call}: {field}={value!r} is invalid; allowed: {allowed}, a finite number"
    )
    assert mailbox_store.messages(isolated_mailbox.mailbox_id) == before  # nothing claimed


def test_an_int_too_long_to_write_is_refused_saying_what_it_is(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    huge = 10**5000  # past the 4,300 digits Python writes

    with pytest.raises(ContractError) as refused:
        isolated_mailbox.wait_for(subject="Welcome", lease=huge)

    assert str(refused.value) == (
        "wait_for: lease=<an int of 16610 bits> is invalid; allowed: seconds > 0, a finite number"
    )


@pytest.mark.parametrize("reason", ["expired_timeout", "bogus", None, True])
def test_a_release_reason_that_is_not_one_is_refused_naming_the_allowed_ones(
    mailbox_store: Store, isolated_mailbox: Mailbox, reason: object
) -> None:
    with pytest.raises(ContractError) as refused:
        isolated_mailbox.release(reason)  # type: ignore[arg-type]

    assert str(refused.value) == (
        f"release: reason={reason!r} is invalid; allowed: 'released_success' or 'released_error'"
    )
    row = mailbox_store.mailbox(isolated_mailbox.mailbox_id)
    assert row is not None
    assert row.state == "reserved"  # nothing was released


def test_a_release_reason_may_be_given_as_its_value(
    mailbox_store: Store, isolated_mailbox: Mailbox
) -> None:
    isolated_mailbox.release("released_error")

    row = mailbox_store.mailbox(isolated_mailbox.mailbox_id)
    assert row is not None
    assert (row.state, row.close_reason) == ("released", "released_error")


def test_expect_none_is_not_set_off_by_a_message_this_run_already_took(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    send(mailbox_server, mail(isolated_mailbox.address))
    isolated_mailbox.wait_for(subject="Welcome", timeout=10).ack()

    isolated_mailbox.expect_none(within=SHORT, subject="Welcome")  # no second one came

    send(mailbox_server, mail(isolated_mailbox.address))
    with pytest.raises(UnexpectedMessage):
        isolated_mailbox.expect_none(within=SHORT, subject="Welcome")


def test_the_receipt_masks_short_codes_and_the_selector_the_run_waited_with(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    to = isolated_mailbox.address
    send(mailbox_server, mail(to, "Code K7Q2X, PIN 123", text="Your code is K7Q2X, PIN 123.\n"))
    msg = isolated_mailbox.wait_for(subject="Code K7Q2X, PIN 123", timeout=10)
    assert msg.code(pattern=r"code is (\w+)") == "K7Q2X"
    assert msg.code(pattern=r"PIN (\d+)") == "123"
    assert "482913" not in repr(Message(b"Subject: Your code 482913\r\n\r\n"))

    receipt = isolated_mailbox.receipt()

    assert "K7Q2X" not in dump_receipt(receipt)
    assert [m.subject for m in receipt.messages] == ["Code •••2X, PIN ••23"]
    waiting = [e.detail for e in receipt.events if e.status == "waiting"]
    assert waiting == ["subject='Code •••2X, PIN ••23'"]  # the selector, masked the same way


# -- link_domains --------------------------------------------------------------------------


def test_a_receipt_shows_the_host_of_an_extracted_link_with_its_code_redacted(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    """The receipt's ``host`` of a link held the host as it was: the code in its label
    went to JUnit XML and the JSON Lines receipts in clear."""
    welcome = "https://483920.app.example.test/welcome"
    send(mailbox_server, mail(isolated_mailbox.address, "Hi", text=f"Open {welcome} now\n"))

    assert isolated_mailbox.wait_for(timeout=5).link() == welcome

    receipt = isolated_mailbox.receipt()
    ((secret,),) = [m.secrets for m in receipt.messages]
    assert (secret.kind, secret.host) == ("link", "….app.example.test")
    assert "483920" not in dump_receipt(receipt)


@pytest.mark.email_contract(link_domains=["app.example.test", "cdn.example.test"])
def test_link_without_a_domain_takes_the_one_link_on_the_contracts_domains(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    verify = "https://app.example.test/verify?token=Zk3Pq9Wm2Lx"
    text = f"Open {verify}\nHelp: https://www.example.org/help\n"
    send(mailbox_server, mail(isolated_mailbox.address, "One", text=text))
    one = isolated_mailbox.wait_for(subject="One", timeout=5)

    assert one.link() == verify  # the link elsewhere is no candidate
    ((secret,),) = [m.secrets for m in isolated_mailbox.receipt().messages]
    assert (secret.kind, secret.host) == ("link", "app.example.test")
    with pytest.raises(ContractError, match=r"link domain 'www\.example\.org' is not allowed"):
        one.link(domain="www.example.org")
    assert one.link(domain="https://app.example.test") == verify  # a host, as a URL
    with pytest.raises(ExtractionError, match=r"^link\(domain=5\): give a host name"):
        one.link(domain=5)  # type: ignore[arg-type]
    with pytest.raises(ContractError) as whole_link:  # the link itself given as its domain
        one.link(domain="https://www.example.org/verify?token=Zk3Pq9Wm2Lx")
    assert "Zk3Pq9Wm2Lx" not in str(whole_link.value)
    assert str(whole_link.value).startswith("link domain 'https://www.example.org/…?token=…' is")

    two = "https://app.example.test/a https://cdn.example.test/b https://www.example.org/c\n"
    send(mailbox_server, mail(isolated_mailbox.address, "Two", text=two))
    second = isolated_mailbox.wait_for(subject="Two", timeout=5)
    with pytest.raises(ExtractionError) as several:
        second.link()
    assert str(several.value).startswith(
        "2 distinct links on app.example.test, cdn.example.test (email_contract link_domains)"
    )
    assert second.link(path="/b") == "https://cdn.example.test/b"
    with pytest.raises(ExtractionError, match=r"^no link on .* link_domains\) under '/c'"):
        second.link(path="/c")  # www.example.org is not on them


@pytest.mark.email_contract(link_domains=["bücher.example"])
def test_link_without_a_domain_finds_a_link_on_an_internationalised_host(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    for subject, host in [("Unicode", "bücher.example"), ("Punycode", "xn--bcher-kva.example")]:
        link = f"https://{host}/verify?token=Zk3Pq9Wm2Lx"
        text = f"Open {link}\nHelp: https://www.example.org/help\n"
        send(mailbox_server, mail(isolated_mailbox.address, subject, text=text))

        message = isolated_mailbox.wait_for(subject=subject, timeout=5)
        assert message.link() == link
        # Either spelling of the host is one of link_domains, whichever the link uses.
        assert message.link(domain="bücher.example") == link
