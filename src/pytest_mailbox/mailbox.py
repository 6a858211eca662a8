"""``Mailbox``: what a test holds. It waits for its own message, claims it, acks it."""

from __future__ import annotations

import asyncio
import functools
import math
import re
import secrets
import sys
import time
import weakref
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field, replace
from datetime import datetime
from difflib import SequenceMatcher
from types import ModuleType
from typing import TYPE_CHECKING, Any, NoReturn, Protocol, TypeVar

from pydantic import ValidationError

from pytest_mailbox._clock import faked, monotonic
from pytest_mailbox.contract import (
    SELECTOR_FIELDS,
    Checkpoint,
    CloseReason,
    EmailContract,
    MessageReceipt,
    Receipt,
    ReceiptEvent,
    SecretDigest,
    Selector,
    SlowSearch,
    Status,
    address_tag_problem,
    describe_validation_error,
    regex_search,
    slow_search_text,
)
from pytest_mailbox.endpoint import Signal, fold_tag, normalize_domain
from pytest_mailbox.errors import (
    AlreadyClaimed,
    AlreadyConsumed,
    AmbiguousMatch,
    ContractError,
    FenceMismatch,
    LeaseExpired,
    MailboxClosed,
    MailboxError,
    UnexpectedMessage,
    WaitTimeout,
)
from pytest_mailbox.message import (
    Message,
    Recorded,
    _visible,
    domain_host,
    extracted_here,
    mask_address,
    mask_copied,
    mask_extracted,
    mask_recorded,
    mask_subject,
    mask_tag,
    remember_extracted,
)
from pytest_mailbox.settings import argument
from pytest_mailbox.store import Handle, History, MailboxRow, MessageRow, Outcome, Store
from pytest_mailbox.vocabulary import DEFAULT_TTL_MAX, shown, utc

if TYPE_CHECKING:
    from pytest_mailbox.agent import AgentTools

__all__ = ["ClaimedMessage", "Mailbox", "new_run_id"]

#: How often a waiter looks at the store for mail that another process's sink took: first
#: ``POLL_FIRST`` after it starts waiting, then after twice as long each time, up to
#: ``POLL_INTERVAL`` (looks at about 1, 3, 7 and 15 ms, then every 10 ms). Mail usually
#: lands soon after a test starts to wait for it (the app sends as the test goes on), so
#: the first looks come quickly; one look costs a ``PRAGMA data_version`` (about 20 µs).
POLL_FIRST = 0.001
POLL_INTERVAL = 0.01

_EXCEPTIONS: dict[Status, type[MailboxError]] = {
    Status.ALREADY_CLAIMED: AlreadyClaimed,
    Status.ALREADY_CONSUMED: AlreadyConsumed,
    Status.FENCE_MISMATCH: FenceMismatch,
    Status.LEASE_EXPIRED: LeaseExpired,
}
#: Mailboxes not yet closed or released, of any scope: a failing test's report masks what
#: they extracted (a session fixture's mailbox extracts before the test that fails).
_LIVE: weakref.WeakSet[Mailbox] = weakref.WeakSet()


def live_extracted() -> set[str]:
    """What the mailboxes still open in this process extracted."""
    return set().union(*(mailbox._extracted for mailbox in list(_LIVE)))


_FAULT_REPLY = re.compile(r"[45]\d\d(?: [ -~]{1,200})?")


def new_run_id() -> str:
    """A run id unique across workers, reruns and pytest runs."""
    return f"r-{secrets.token_hex(8)}"


#: What a test may close its mailbox with (``expired_timeout`` is the ttl's to give).
_RELEASE_REASONS = (CloseReason.RELEASED_SUCCESS, CloseReason.RELEASED_ERROR)


# What the waits take besides a selector's fields, said beside them when a field is unknown.
_WAIT_OWN = "; wait_for's own arguments: timeout, lease"
_NONE_OWN = "; expect_none's own argument: within"
#: What a positional argument should have been, by the call it was given to.
_KEYWORDS_ONLY = {
    "wait_for": "wait_for(subject='Verify your address') or wait_for(subject_contains='Verify')",
    "expect_none": "expect_none(within=2, subject_contains='Verify')",
}


def _seconds(call: str, name: str, value: object, *, zero: bool = False) -> None:
    """Refuse a duration given to one call that is not a finite number of seconds above
    zero (or at least zero): a lease of 0 would hand back a claim already lapsed, and a
    NaN timeout would never end."""
    __tracebackhide__ = True
    if value is None:
        return
    ok = False
    if isinstance(value, int | float) and not isinstance(value, bool):
        try:
            ok = math.isfinite(value) and (value >= 0 if zero else value > 0)
        except OverflowError:  # an int past any float: no duration
            ok = False
    if not ok:
        allowed = "seconds >= 0" if zero else "seconds > 0"
        msg = f"{call}: {name}={shown(value)} is invalid; allowed: {allowed}, a finite number"
        raise ContractError(msg)


@functools.lru_cache(maxsize=16)
def _domain(domain: str) -> str:
    """``domain`` as ``mailbox_domain`` takes it (``ValueError`` otherwise), remembered:
    every test of a run reserves on the same one, and checking it costs a microsecond."""
    return str(argument("domain", domain, str))


def _describe(selector: Selector) -> str:
    """The selector as errors and the timeline show it: digit runs and extracted secrets
    masked, as in subjects (a test may look for a code it was given); a tag as an address
    shows it (``mask_address``)."""
    if selector.tag:
        selector = selector.model_copy(update={"tag": mask_tag(selector.tag)})
    return selector.describe(mask_copied)


def _quoted(value: str) -> str:
    """A selector value quoted in a near-miss reason, masked as ``_describe`` masks it:
    as written, then as quoted."""
    return mask_copied(repr(mask_copied(value)))


def _tag(tag: str | None) -> str:
    """A plus-tag in a near-miss reason: quoted and masked as an address's tag is (a
    reply-by-mail token), or said to be none."""
    return _quoted(mask_tag(tag)) if tag else "none (sent to the alias alone)"


def _tag_masked(address: str) -> str:
    """A look-alike's envelope recipient with its tag masked (a reply-by-mail token), its
    alias as written: the typo is what a reader compares with the test's own alias. A
    character that shows nothing (a direction override in a tag taken with SMTPUTF8) is
    escaped, as in a sender's address: it reordered the near miss's line in a terminal."""
    local, at, domain = address.rpartition("@")
    alias, plus, tag = local.partition("+")
    return _visible(f"{alias}{plus}{mask_tag(tag) if tag else ''}{at}{domain}")


def _similar(alias: str, mine: str) -> bool:
    """A look-alike of this mailbox's alias: a typo, a prefix or suffix too many or few."""
    return mine in alias or alias in mine or SequenceMatcher(None, alias, mine).ratio() >= 0.8


def _clock(ts: float) -> str:
    """``16:30:05.250 UTC``: a moment in an error, to set beside the timeline's."""
    return f"{utc(ts):%H:%M:%S.%f}"[:-3] + " UTC"


_T = TypeVar("_T")
#: A wait's lease wake-ups (``Mailbox._lapse``): (message_id, fence, lease_until) to when
#: it wakes (monotonic()) and the store's time it was reckoned at.
_Woken = dict[tuple[str, int | None, float], tuple[float, float]]


@dataclass(frozen=True)
class _Pause:
    """Where a waiter paused: the signal generation and store version it saw, and until when."""

    generation: int
    version: int
    until: float  # monotonic()
    #: When to look again before ``until`` though nothing changed (monotonic()): a
    #: lease that ends makes its message a candidate again, and no commit says so.
    wake: float = field(default=math.inf, kw_only=True)

    def remaining(self) -> float:
        return self.until - monotonic()

    def awake_in(self) -> float:
        """How long the runner may sleep before the steps look again."""
        return min(self.remaining(), self.wake - monotonic())


class _Stop(Protocol):
    """What ends a ``look_for`` early once set: a ``threading.Event``, or any such flag."""

    def is_set(self) -> bool: ...


@dataclass(frozen=True)
class _StoppablePause(_Pause):
    """A pause that ends early once ``stop`` is set (``look_for(stop=)``)."""

    stop: _Stop

    def remaining(self) -> float:
        return 0.0 if self.stop.is_set() else super().remaining()


class ClaimedMessage(Message):
    """A message this run holds under a lease: ``ack()`` consumes it, ``release()`` returns it."""

    def __init__(self, raw: bytes, row: MessageRow, mailbox: Mailbox, outcome: Outcome) -> None:
        super().__init__(
            raw,
            message_id=row.message_id,
            envelope_from=row.mail_from,
            envelope_to=row.rcpt,
            received_at=utc(row.received_at),
            seq=row.seq,
            on_secret=mailbox._record_secret(row.message_id),
        )
        self.mailbox = mailbox
        self.fence: int = outcome.fence or 0
        self.lease_until: datetime | None = (
            utc(outcome.lease_until) if outcome.lease_until is not None else None
        )

    def link(self, domain: str | None = None, *, path: str | None = None) -> str:
        """The one distinct link on ``domain`` under ``path``; with the contract's
        ``link_domains`` and no ``domain``, the one link on any of them (links elsewhere are
        not candidates)."""
        __tracebackhide__ = True
        allowed = self.mailbox.contract.link_domains
        if allowed and domain is None:
            candidates, where, hint = self._link_candidates(None, path, hosts=set(allowed))
            where = f" on {', '.join(allowed)} (email_contract link_domains)" + where
            return self._one_link(candidates, where, hint)
        # Not a string: Message.link says what a domain must be. A URL's host counts
        # (domain="https://app.example.test", which Message.link takes as that host).
        if (
            allowed
            and isinstance(domain, str)
            and (host := domain_host(domain))
            and normalize_domain(host) not in allowed
        ):
            msg = (
                f"link domain {mask_copied(domain)!r} is not allowed by email_contract "
                f"link_domains={list(allowed)}; pass one of them as domain=, or none"
            )
            raise ContractError(msg)
        return super().link(domain, path=path)

    def ack(self) -> None:
        """Consume the message: refused if the lease expired or a newer holder exists."""
        __tracebackhide__ = True
        self.mailbox.ack(self.message_id, self.fence)

    def release(self) -> None:
        """Give the message back unconsumed, so it can be claimed again."""
        __tracebackhide__ = True
        self.mailbox.release_claim(self.message_id, self.fence)

    def renew(self, lease: float | None = None) -> None:
        """Extend the lease under the same fence."""
        __tracebackhide__ = True
        outcome = self.mailbox.renew(self.message_id, self.fence, lease)
        if outcome.lease_until is not None:
            self.lease_until = utc(outcome.lease_until)


class Mailbox:
    """One reserved alias for one run, under one contract."""

    def __init__(
        self,
        store: Store,
        row: MailboxRow,
        *,
        contract: EmailContract,
        signal: Signal | None = None,
        nodeid: str = "",
    ) -> None:
        self.store = store
        self.contract = contract
        self.nodeid = nodeid
        self._row = row
        self._signal = signal or Signal()
        self._since: Checkpoint | None = None
        self._parsed: dict[int, Message] = {}
        self._extracted: set[str] = set()  # the links and codes taken from its messages
        _LIVE.add(self)
        #: The last ``waiting`` step recorded since the last claim: a wait for something
        #: else records its own, and so does any wait after a claim.
        self._waiting: str | None = None
        self._agent: AgentTools | None = None

    @classmethod
    def reserve(
        cls,
        store: Store,
        *,
        contract: EmailContract,
        domain: str,
        run_id: str | None = None,
        nodeid: str = "",
        signal: Signal | None = None,
        ttl_max: int = DEFAULT_TTL_MAX,
    ) -> Mailbox:
        """Reserve (or, for the same run and purpose, find again) a mailbox.

        The contract is held to ``ttl_max`` (the plugin passes ``mailbox_ttl_max``) and its
        lease to its ttl, as the plugin holds a marker: ``ContractError`` names the fix. A
        ttl nobody gave is at most ``ttl_max``, as in the plugin's settings. ``domain`` and
        ``ttl_max`` take what ``mailbox_domain`` and ``mailbox_ttl_max`` take.
        """
        if not isinstance(contract, EmailContract):
            msg = (
                f"Mailbox.reserve: contract={contract!r} is invalid; allowed: an EmailContract "
                "(EmailContract(**fields) builds one from a dict)"
            )
            raise ContractError(msg)
        try:
            ttl_max = argument("ttl_max", ttl_max, (int, float))
            # Not a string: refused, and never hashed by the cache.
            domain = _domain(domain) if isinstance(domain, str) else argument("domain", domain, str)
        except ValueError as exc:
            msg = f"Mailbox.reserve: {exc}"
            raise ContractError(msg) from None
        if "ttl" not in contract.model_fields_set and contract.ttl > ttl_max:
            given = contract.model_dump(exclude_unset=True)
            contract = EmailContract(**{**given, "ttl": ttl_max})
        try:
            contract.check_limits(
                ttl_max=ttl_max,
                source="Mailbox.reserve",
                raise_max="pass a larger ttl_max= (the plugin passes mailbox_ttl_max)",
            )
        except ValueError as exc:
            raise ContractError(str(exc)) from None
        row, _ = store.reserve(
            run_id=run_id or new_run_id(),
            purpose=contract.purpose,
            ttl=contract.ttl,
            domain=domain,
            owner=nodeid,
            fresh=run_id is None,
        )
        return cls(store, row, contract=contract, signal=signal, nodeid=nodeid)

    # -- identity ----------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self._row.address

    @property
    def alias(self) -> str:
        return self._row.alias

    def tagged(self, tag: str) -> str:
        """This mailbox's address with a plus-tag, ``alias+tag@domain``: mail to it is
        routed here, and ``wait_for(tag=...)`` tells it from mail to the plain address
        (a second address for one test, as an invitation to a friend needs)."""
        __tracebackhide__ = True
        problem = address_tag_problem(tag) or self._room_problem(tag)
        if problem is not None:
            said = shown(mask_tag(tag) if isinstance(tag, str) else tag)
            msg = f"tagged: tag={said} is invalid; allowed: {problem}"  # a token's masked
            raise ContractError(msg)
        return f"{self.alias}+{fold_tag(tag)}@{self.domain}"

    def _room_problem(self, tag: str) -> str | None:
        """Why ``tag`` makes this alias's local part longer than RFC 5321's 64 octets, or
        None: the room left beside the alias, in characters (octets beyond ASCII)."""
        room = 64 - len(self.alias) - 1
        if len(fold_tag(tag).encode("utf-8")) <= room:
            return None
        unit = "characters" if tag.isascii() else "octets of UTF-8"
        return f"a plus-tag of at most {room} {unit} beside the alias {self.alias}"

    @property
    def domain(self) -> str:
        return self._row.domain

    @property
    def run_id(self) -> str:
        return self._row.run_id

    @property
    def mailbox_id(self) -> str:
        return self._row.mailbox_id

    @property
    def purpose(self) -> str:
        return self._row.purpose

    @property
    def fence(self) -> int:
        return self._row.fence

    @property
    def expires_at(self) -> datetime:
        return utc(self._row.expires_at)

    @property
    def _handle(self) -> Handle:
        """This reservation, as the store checks it on a claim's ack, renew and release."""
        return Handle(self._row.mailbox_id, self._row.fence)

    @property
    def state(self) -> str:
        """The reservation's state now: reserved, waiting, claimed, consumed, released, expired.

        A mailbox gone from its store (the file was removed or replaced) has no state:
        ``MailboxClosed`` (``policy_denied``) says so, as every operation on it does. It did
        not expire, and no ttl explains it."""
        __tracebackhide__ = True
        row = self.store.mailbox(self.mailbox_id)
        if row is None:
            raise self._refused(Status.POLICY_DENIED, None)
        return row.state

    def __repr__(self) -> str:
        return f"<Mailbox {self.address} run={self.run_id} id={self.mailbox_id}>"

    def __str__(self) -> str:
        """The address, so that a mailbox handed where an address goes (a form field,
        ``f"{isolated_mailbox}"``) is one: its repr there was sent as a recipient."""
        return self.address

    # -- waiting -----------------------------------------------------------------------

    def checkpoint(self) -> Checkpoint:
        """Mark now: later waits only consider messages committed after this point.
        Refused (``MailboxClosed``) once the mailbox is closed, as every operation is."""
        __tracebackhide__ = True
        self._ensure_open()
        self._since = self.store.checkpoint()
        if self._agent is not None:  # its agent's tools in another process (MCP) too
            self._agent.checkpointed(self._since)
        return self._since

    def wait_for(
        self,
        *positional: NoReturn,
        timeout: float | None = None,
        lease: float | None = None,
        **selector: Any,
    ) -> ClaimedMessage:
        """Wait for exactly one matching message and claim it under the contract's lease."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        _keywords_only("wait_for", positional)
        return self._run(self._wait_steps(self._selector(selector, _WAIT_OWN), timeout, lease))

    async def wait_for_async(
        self,
        *positional: NoReturn,
        timeout: float | None = None,
        lease: float | None = None,
        **selector: Any,
    ) -> ClaimedMessage:
        """``wait_for`` for async tests: the same steps, awaiting instead of blocking."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        _keywords_only("wait_for", positional)
        return await self._run_async(
            self._wait_steps(self._selector(selector, _WAIT_OWN), timeout, lease)
        )

    def expect_none(
        self, *positional: NoReturn, within: float | None = None, **selector: Any
    ) -> None:
        """Pass only if no matching message arrives within ``within`` seconds (a real wait).
        ``within`` is required; it has a default only to be refused as a ``ContractError``."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        _keywords_only("expect_none", positional)
        self._run(self._none_steps(self._selector(selector, _NONE_OWN), within))

    async def expect_none_async(
        self, *positional: NoReturn, within: float | None = None, **selector: Any
    ) -> None:
        """``expect_none`` for async tests."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        _keywords_only("expect_none", positional)
        await self._run_async(self._none_steps(self._selector(selector, _NONE_OWN), within))

    def look_for(
        self,
        keep: Callable[[Message], bool],
        *,
        timeout: float,
        stop: _Stop | None = None,
        selector: Selector | None = None,
    ) -> list[tuple[MessageRow, Message]]:
        """Wait up to ``timeout`` seconds for unclaimed messages after the checkpoint that
        ``selector`` matches and ``keep`` accepts, claiming none: those of the first look
        that finds any, or none. Marks the mailbox waiting, as ``wait_for`` does (the
        agent's ``wait_for_message``). Setting ``stop`` ends the wait at the next poll,
        with one more look."""
        selector = selector or Selector()
        self._mark_waiting(_describe(selector))
        deadline = monotonic() + timeout

        def steps() -> Generator[_Pause, None, list[tuple[MessageRow, Message]]]:
            woken: _Woken = {}
            while True:
                pause = self._pause_point(deadline)
                if stop is not None:
                    pause = _StoppablePause(pause.generation, pause.version, pause.until, stop)
                matches, misses = self._scan(selector)
                parsed = [(row, self._parsed_message(row)) for row in matches]
                kept = [(row, message) for row, message in parsed if keep(message)]
                if kept or pause.remaining() <= 0:
                    return kept
                yield replace(pause, wake=self._lapse(misses, selector, woken))

        return self._run(steps())

    # One implementation of waiting: a generator of steps that yields each time it has to
    # pause, driven by a blocking runner (_run) or an awaiting one (_run_async).

    def _wait_steps(
        self, chosen: Selector, timeout: float | None, lease: float | None
    ) -> Generator[_Pause, None, ClaimedMessage]:
        __tracebackhide__ = True
        _seconds("wait_for", "timeout", timeout, zero=True)
        _seconds("wait_for", "lease", lease)
        limit = self.contract.timeout if timeout is None else timeout
        deadline = monotonic() + limit
        # The first look of a wait that has not marked itself waiting takes no pause point:
        # if it finds nothing it marks, and looks again from a pause point taken then.
        pause: _Pause | None = None
        described = _describe(chosen)
        # This wait's own: two waits at once (threads, tasks) for two things must not mark
        # in turn, each mark waking the other for the next.
        marked = looked = self._waiting == described
        woken: _Woken = {}  # the leases it wakes for (_lapse)
        while True:
            if looked:
                pause = self._pause_point(deadline)
            looked = True
            matches, misses = self._scan(chosen, check_open=False)
            if len(matches) != 1:  # one candidate goes to the claim, which checks it instead
                self._ensure_open()
            if len(matches) > 1:
                if not marked:
                    self._record_waiting(described)
                listed = ", ".join(f"{m.message_id} ({self._subject(m)!r})" for m in matches)
                msg = (
                    f"{len(matches)} messages for {self.address} match {described}: "
                    f"{listed}; make the selector stricter (subject=, header=, received_after=)"
                )
                raise AmbiguousMatch(
                    self._unleaked(msg), result={"message_ids": [m.message_id for m in matches]}
                )
            if matches:
                waiting = None if marked or self._waiting == described else described
                marked, self._waiting = True, described  # the claim records it, whatever
                outcome = self._claim(matches[0], lease, waiting=waiting)
                if outcome.status is Status.CLAIMED:
                    return ClaimedMessage(outcome.raw or b"", matches[0], self, outcome)
                self._ensure_open()  # a closed mailbox refused the claim: say so now
            if not marked:
                # Once, before the first pause. Then look again from after it: a pause point
                # taken before this write would count it as news and wake at the first look.
                # (Not if a wait for the same, begun at once in another thread, marked it.)
                self._mark_waiting(described)
                marked = True
                continue
            if pause is None:  # a refused claim at the first look: look again, then pause
                continue
            if pause.remaining() <= 0:
                raise WaitTimeout(self._timeout_text(chosen, limit, misses))
            yield replace(pause, wake=self._lapse(misses, chosen, woken))

    def _none_steps(self, chosen: Selector, within: float | None) -> Generator[_Pause, None, None]:
        __tracebackhide__ = True
        if within is None:  # a timeout= given instead was refused by the selector, naming it
            msg = "expect_none: within= is required: the seconds in which no match may arrive"
            raise ContractError(msg)
        _seconds("expect_none", "within", within, zero=True)
        deadline = monotonic() + within
        while True:
            pause = self._pause_point(deadline)
            matches, _ = self._scan(chosen, include_taken=True)
            if matches:
                first = matches[0]
                msg = (
                    f"expected no message for {self.address} matching {_describe(chosen)} "
                    f"within {within:g}s, but {first.message_id} ({self._subject(first)!r}) arrived"
                )
                raise UnexpectedMessage(
                    self._unleaked(msg), result={"message_id": first.message_id}
                )
            if pause.remaining() <= 0:
                return
            yield pause

    def _lapse(
        self,
        misses: list[tuple[MessageRow, str]],
        selector: Selector,
        woken: _Woken,
    ) -> float:
        """When the first live lease ends that holds a message ``selector`` would take
        (monotonic()), or never: a wait looks again then, since an expired claim may
        be claimed again (a holder that crashed or gave up) and nothing is committed when a
        lease ends.

        ``woken`` (the wait's own) keeps each live lease's wake-up, and the store's time when
        it was reckoned: a look for other news before then keeps it (under xdist other
        tests write all the time). Once it is past and the lease still holds, it is
        reckoned again only if the store's clock moved since, either way (a wall clock set
        back): one that stands still (a test's fake clock) must not make the wait look
        again and again."""
        now, moment = self.store.clock(), monotonic()
        live: _Woken = {}
        for row, _ in misses:
            if not row.leased(now) or row.lease_until is None or not self._selects(row, selector):
                continue
            lease = (row.message_id, row.fence, row.lease_until)
            wake, reckoned = woken.get(lease, (-math.inf, -math.inf))
            if wake <= moment and now != reckoned:  # first seen, or woken early by the clocks
                wake, reckoned = moment + row.lease_until - now, now
            live[lease] = (wake, reckoned)
        woken.clear()  # a lease renewed, taken or ended is not looked for again
        woken.update(live)
        return min((wake for wake, _ in live.values() if wake > moment), default=math.inf)

    def _pause_point(self, deadline: float) -> _Pause:
        """What the store looks like now, taken before a scan so no commit slips between."""
        # Wake at the mailbox's expiry too, so the next scan reports it at once.
        expiry = monotonic() + self._row.expires_at - self.store.clock()
        return _Pause(self._signal.generation, self.store.data_version(), min(deadline, expiry))

    def _changed(self, pause: _Pause) -> bool:
        return (
            self._signal.generation != pause.generation
            or self.store.data_version() != pause.version
        )

    def _run(self, steps: Generator[_Pause, None, _T]) -> _T:
        """Drive the steps, blocking: the in-process signal wakes at once, the store is polled."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        polls = _polls()  # one schedule per wait: a busy store does not restart it
        try:
            pause = next(steps)
            while True:
                for interval in polls:
                    if (left := pause.awake_in()) <= 0:
                        break
                    self._signal.wait(pause.generation, min(interval, left))
                    if self._changed(pause):
                        break
                pause = steps.send(None)
        except StopIteration as done:
            result: _T = done.value
            return result
        except WaitTimeout as timeout:
            if not _loop_running():
                raise
            msg = f"{timeout}\n{_BLOCKED_LOOP}"
            raise WaitTimeout(msg, result=timeout.result) from None

    async def _run_async(self, steps: Generator[_Pause, None, _T]) -> _T:
        """Drive the steps, awaiting: the event loop stays free while the mailbox waits."""
        __tracebackhide__ = True  # its arguments (the selector) may hold a code
        polls = _polls()
        try:
            pause = next(steps)
            while True:
                for interval in polls:
                    if (left := pause.awake_in()) <= 0:
                        break
                    await async_sleep(min(interval, left))
                    if self._changed(pause):
                        break
                pause = steps.send(None)
        except StopIteration as done:
            result: _T = done.value
            return result

    def _selector(self, given: dict[str, Any], own: str = "") -> Selector:
        """``given`` as a Selector; ``own`` names the call's own arguments, which a misspelt
        one (``timout=``) would otherwise not see among the fields the refusal lists."""
        __tracebackhide__ = True
        try:
            return Selector(**given)
        except ValidationError as exc:
            raise ContractError(
                describe_validation_error("selector", exc, SELECTOR_FIELDS, own=own)
            ) from None

    def _mark_waiting(self, described: str) -> None:
        """The timeline's ``waiting`` step, unless the last one since a claim was for this
        (the agent's repeated ``wait_for_message``)."""
        if self._waiting != described:
            self._record_waiting(described)

    def _record_waiting(self, described: str) -> None:
        """A ``waiting`` step: a test that hangs in its second wait shows which."""
        self._waiting = described
        self.store.mark(self.mailbox_id, self.fence, Status.WAITING, described)

    def _ensure_open(self) -> None:
        __tracebackhide__ = True
        row = self.store.mailbox(self.mailbox_id)
        if row is None:  # not closed: gone, which no ttl explains
            state, reason = Status.POLICY_DENIED, None
        elif not row.active or row.fence != self.fence:
            state = Status.FENCE_MISMATCH if row.active else Status(row.state)
            reason = row.close_reason
        else:
            return
        raise self._refused(state, reason)

    def _refused(self, state: Status, reason: str | None) -> MailboxClosed:
        """The refusal of a closed, stale or vanished (``policy_denied``) reservation."""
        msg = f"{state.value}: {self._closed(state, reason)}"
        return MailboxClosed(msg, status=state, result={"mailbox_id": self.mailbox_id})

    def _raise_for(self, outcome: Outcome, what: str) -> Outcome:
        """Return a successful outcome; raise the typed exception of a failed one, with why
        and what to do."""
        __tracebackhide__ = True
        if outcome.status in (Status.CLAIMED, Status.CONSUMED, Status.WAITING):
            return outcome
        detail = f": {outcome.detail}" if outcome.detail else ""
        message = f"{what}: {outcome.status.value}{detail}"
        if outcome.status in (Status.RELEASED, Status.EXPIRED):
            message = (
                f"{what}: {outcome.status.value}; {self._closed(outcome.status, outcome.detail)}"
            )
        elif outcome.status is Status.ALREADY_CONSUMED:
            by = "this run" if outcome.holder == self.run_id else f"run {outcome.holder}"
            message += (
                f"; {by} acked it already, and an ack is final: a message is consumed once, "
                "so nothing is left to ack, renew or release (retrying an ack that succeeded "
                "is a second click)"
            )
        elif outcome.status is Status.ALREADY_CLAIMED and outcome.lease_until is not None:
            left = outcome.lease_until - self.store.clock()
            until = f"{left:.3g}s more, until {_clock(outcome.lease_until)}"
            if outcome.holder == self.run_id:
                message += (
                    f"; this run holds it already, for {until}: use the ClaimedMessage that "
                    "wait_for() or claim() returned, whose fence proves the claim"
                )
            else:
                message += (
                    f"; run {outcome.holder} holds it for {until}: it can be claimed when "
                    "that lease ends unacked, or wait_for() another message"
                )
        elif outcome.status is Status.LEASE_EXPIRED and outcome.lease_until is not None:
            ago = self.store.clock() - outcome.lease_until
            message += (
                f"; its lease ended {ago:.3g}s ago, at {_clock(outcome.lease_until)}: ack or "
                f"renew() it while the lease lasts, or claim with a longer lease "
                f"(lease=, email_contract lease={self.contract.lease:g})"
            )
        error = _EXCEPTIONS.get(outcome.status)
        if error is None:
            raise MailboxClosed(message, status=outcome.status, result=outcome.as_dict())
        raise error(message, result=outcome.as_dict())

    def _closed(self, state: Status, reason: str | None) -> str:
        """Why a closed (or vanished) mailbox refuses, and what to do instead."""
        test = f" (test {self.nodeid})" if self.nodeid else ""
        if state is Status.EXPIRED:
            return (
                f"mailbox {self.address}{test} outlived its ttl of {self.contract.ttl:g}s "
                f"(email_contract ttl), at {_clock(self._row.expires_at)}; raise ttl"
            )
        if state is Status.RELEASED:
            return (
                f"mailbox {self.address}{test} was released ({reason or 'released'}), and "
                "refuses every call after that: wait for, claim and ack its mail before "
                "release() or close(); a mailbox serves one test, and each test gets its own "
                "isolated_mailbox"
            )
        if state is Status.POLICY_DENIED:
            return (
                f"mailbox {self.address}{test} is not in the store {self.store.path}: the file "
                "was removed or replaced while the run used it (two pytest runs with one "
                "--basetemp share it; give each its own)"
            )
        return "another handle reserved it again; use the mailbox reserve() returned last"

    # -- matching ----------------------------------------------------------------------

    def _parsed_message(self, row: MessageRow) -> Message:
        parsed = self._parsed.get(row.body_id)
        if parsed is None:
            parsed = Message(self.store.raw(row.body_id), message_id=row.message_id)
            self._parsed[row.body_id] = parsed
        return parsed

    def _digests(self) -> Recorded:
        return Recorded.of(self.store.secrets(self.mailbox_id), self.store.digest)

    def _subject(self, row: MessageRow) -> str:
        """A subject fit for an error message: links, tokens, codes and what this run
        extracted masked (``mask_subject``)."""
        return mask_subject(row.subject, self._digests(), extracted_here(self._extracted))

    def _unleaked(self, text: str, recorded: Recorded | None = None) -> str:
        """An error text with every secret this run extracted masked, wherever it shows:
        a test may look for the code it was given (``body_contains=code``). ``recorded``:
        the digests, if the caller read them already."""
        recorded = self._digests() if recorded is None else recorded
        # Its own values whatever their length (a PIN of three), and the process's.
        return mask_extracted(mask_recorded(text, recorded), also=self._extracted)

    def _scan(
        self, selector: Selector, *, include_taken: bool = False, check_open: bool = True
    ) -> tuple[list[MessageRow], list[tuple[MessageRow, str]]]:
        """(candidates, near misses with one reason each) among this mailbox's mail."""
        if check_open:
            self._ensure_open()
        now = self.store.clock()
        matches: list[MessageRow] = []
        misses: list[tuple[MessageRow, str]] = []
        for row in self.store.messages(self.mailbox_id):
            reason = self._reject(row, selector, now, include_taken)
            if reason is None:
                matches.append(row)
            else:
                misses.append((row, reason))
        return matches, misses

    def _reject(
        self, row: MessageRow, selector: Selector, now: float, include_taken: bool
    ) -> str | None:
        origin = self._origin_reason(row, selector)
        if origin is not None:
            return origin
        if include_taken and row.holder == self.run_id:  # expect_none: not news to this run
            return f"claimed by this run before (fence {row.fence})"
        if not include_taken:
            if row.state == Status.CONSUMED.value:
                return f"already consumed (fence {row.fence})"
            if row.leased(now):
                if row.holder == self.run_id:  # a wait_for repeated, say: the claim is in hand
                    # The hint only for a message this wait would take; else why it would not.
                    content = self._content_reason(row, selector)
                    return content or (
                        f"already claimed by this run (fence {row.fence}): its holder (a "
                        "ClaimedMessage of the test, or the agent's claim) acks or releases it"
                    )
                return f"already claimed by run {row.holder} (fence {row.fence})"
        return self._content_reason(row, selector)

    def _selects(self, row: MessageRow, selector: Selector) -> bool:
        """Whether ``selector`` picks ``row``, whatever its claim: a retried claim finds the
        message it holds (the agent's ``claim_message`` by selector)."""
        return (
            self._origin_reason(row, selector) is None
            and self._content_reason(row, selector) is None
        )

    def _origin_reason(self, row: MessageRow, selector: Selector) -> str | None:
        """Why ``row`` is not this wait's mail at all (too early, another run's), or None."""
        if self._too_early(row, selector):
            return "received before received_after"
        owner = self._other_run(row)
        if owner is not None:
            return f"{self.contract.run_header} belongs to run {owner}"
        return None

    def _too_early(self, row: MessageRow, selector: Selector) -> bool:
        """Whether ``row`` came before the selector's ``received_after`` (or the checkpoint)."""
        after = selector.received_after if selector.received_after is not None else self._since
        if isinstance(after, Checkpoint):
            return row.seq <= after.seq
        if isinstance(after, datetime | float | int):
            # To the microsecond, as ``received_at`` shows it: a message's own time given
            # back (``received_after=msg.received_at``) finds it, every time.
            moment = after if isinstance(after, datetime) else utc(after)
            return utc(row.received_at) < moment
        return False

    def _other_run(self, row: MessageRow) -> str | None:
        """The other run the message's run header names, or None (none, or this run)."""
        owner = self._run_header(row)
        return owner if owner and owner != self.run_id else None

    def _run_header(self, row: MessageRow) -> str | None:
        """The run id the message names: the sink indexes X-Run-Id; another name is parsed."""
        if self.contract.run_header.lower() == "x-run-id":
            return row.run_header
        return self._parsed_message(row).run_header(self.contract.run_header)

    def _content_reason(self, row: MessageRow, selector: Selector) -> str | None:
        if selector.tag is not None and (row.tag or "") != selector.tag:
            return f"its tag is {_tag(row.tag)}, not {_tag(selector.tag)}"
        subject = row.subject
        if selector.subject is not None and subject != selector.subject:
            return f"subject is not {_quoted(selector.subject)}"
        if selector.subject_contains is not None and selector.subject_contains not in subject:
            return f"subject does not contain {_quoted(selector.subject_contains)}"
        if selector.subject_regex is not None and not self._found(
            "subject_regex", selector.subject_regex, subject
        ):
            return f"subject does not match /{mask_copied(selector.subject_regex)}/"
        if selector.sender is not None:
            wanted = selector.sender.lower()
            parsed = self._parsed_message(row)
            if wanted not in (parsed.sender.lower(), row.mail_from.lower()):
                # The mail's sender: a direction override in it reordered the line.
                sent = _visible(mask_address(parsed.sender or row.mail_from))
                return f"sender {sent} is not {mask_copied(mask_address(selector.sender))}"
        if selector.header is not None:
            name, value = selector.header
            found = self._parsed_message(row).header(name)
            if found is None:
                return f"has no {name} header"
            if found.strip() != value:
                return f"header {name} is not {_quoted(value)}"
        if selector.body_contains is not None or selector.body_regex is not None:
            body = self._parsed_message(row).body_text
            html = self._parsed_message(row).html
            if selector.body_contains is not None and not (
                selector.body_contains in body or selector.body_contains in html
            ):
                return f"body does not contain {_quoted(selector.body_contains)}"
            if selector.body_regex is not None and not (
                self._found("body_regex", selector.body_regex, body)
                or self._found("body_regex", selector.body_regex, html)
            ):
                return f"body does not match /{mask_copied(selector.body_regex)}/"
        return None

    def _found(self, field: str, pattern: str, text: str) -> bool:
        """``pattern`` is found in ``text``; a search that backtracks past ``SEARCH_LIMIT``
        is stopped and refused (``ContractError``), since its wait could never end in time."""
        __tracebackhide__ = True
        try:
            return regex_search(pattern, text)
        except SlowSearch:
            shown = f"selector: {field}", repr(mask_copied(pattern))
            msg = slow_search_text(*shown, len(text))
            raise ContractError(self._unleaked(msg), result={"field": field}) from None

    def _timeout_text(
        self, selector: Selector, limit: float, misses: list[tuple[MessageRow, str]]
    ) -> str:
        lines = [
            f"no message for {self.address} matched {_describe(selector)} within {limit:g}s "
            f"(run {self.run_id}, mailbox {self.mailbox_id})"
        ]
        # Unrouted mail for a look-alike alias only: another test's typo is not ours to show.
        # At any domain the sink takes: the alias right, the domain another (a second entry
        # of mailbox_allowed_domains) is this test's mail sent to the wrong place.
        unrouted = [
            (row, f"envelope recipient {_tag_masked(row.rcpt)} is not {self.address}")
            for row in self.store.unrouted(None, since=self._row.created_at)
            if _similar(row.alias, self.alias)
        ]
        # Mail for an earlier attempt of this test (a rerun): its app kept that address.
        earlier = [
            (
                row,
                f"sent to {_tag_masked(row.rcpt)}, the address of an earlier run of this "
                f"test (run {run_id}, closed): the app kept the address that run was given; "
                f"give it this run's, {self.address}",
            )
            for row, _, run_id in self.store.earlier_runs_mail(
                self.mailbox_id, since=self._row.created_at
            )
        ]
        near = misses + unrouted + earlier
        refused = self.store.refused(self.mailbox_id)
        late = self._late_mail()
        if not near and not refused and not late:
            lines.append(
                "no mail arrived for this mailbox or an unknown alias like it: is the "
                "app sending to the sink (mailbox_server.host and .port, or .settings) and to "
                "this address? A framework's test set-up may swap in a backend that sends "
                "nothing (Django's locmem, Flask-Mail's MAIL_SUPPRESS_SEND): see Recipes"
            )
        if near:
            lines.append(f"near misses ({len(near)}):")
            lines.extend(
                f"  - {row.message_id} {self._subject(row)!r}: {reason}" for row, reason in near
            )
        if refused:
            # Nothing of these was stored: the app was told so, and may not have said.
            lines.append(f"refused by the sink for this alias, and not stored ({len(refused)}):")
            lines.extend(f"  - {_clock(row['at'])} {row['detail']}" for row in refused)
        lines.extend(late)
        lines.extend(self._ahead(selector))
        return self._unleaked("\n".join(lines))

    def _late_mail(self) -> list[str]:
        """Lines for mail that came, while this mailbox was open, for the mailbox of an
        earlier test of this process that had been released: an app that kept that test's
        address (a user it made then) sends there still. Its address and test only: what
        the mail says is that test's."""
        row = self._row
        late = self.store.late(
            since=row.created_at, worker=row.worker, testrun=row.testrun, owner=row.owner
        )
        if not late:
            return []
        shown = late[-5:]
        more = " or more" if len(late) > len(shown) else ""
        lines = [
            f"mail for an earlier test's mailbox, released before it came ({len(shown)}{more}): "
            "is the app sending to an address it kept from that test?"
        ]
        lines.extend(
            f"  - {_clock(message.received_at)} to {_tag_masked(message.rcpt)} "
            f"(test {mailbox.owner or '?'}, released at {_clock(mailbox.closed_at or 0.0)})"
            for message, mailbox in shown
        )
        return lines

    def _ahead(self, selector: Selector) -> list[str]:
        """A line if ``received_after`` is a time later than the sink's clock now: most
        often ``datetime.now()`` under a test's frozen or moved clock, which the sink's
        clock is not."""
        after = selector.received_after
        if not isinstance(after, datetime | float | int):
            return []
        moment = after.timestamp() if isinstance(after, datetime) else float(after)
        now = self.store.clock()
        if moment <= now:
            return []
        return [
            f"received_after ({_clock(moment)} on {utc(moment):%Y-%m-%d}) is later than the "
            f"sink's clock ({_clock(now)} on {utc(now):%Y-%m-%d}): only a message that "
            "arrives after it matches. The sink's clock is the machine's, not a test's frozen "
            "or moved one (freezegun, time-machine): received_after="
            "isolated_mailbox.checkpoint() needs no clock"
        ]

    # -- claims ------------------------------------------------------------------------

    def _claim(
        self, row: MessageRow, lease: float | None, *, waiting: str | None = None
    ) -> Outcome:
        outcome = self.store.claim(
            mailbox_id=self.mailbox_id,
            mailbox_fence=self.fence,
            message_id=row.message_id,
            holder=self.run_id,
            lease=self.contract.lease if lease is None else lease,
            waiting=waiting,
        )
        if outcome.status is Status.CLAIMED:
            self._waiting = None  # the next wait, for the same again too, is news
        return outcome

    def claim(
        self,
        message_id: str | None = None,
        *,
        lease: float | None = None,
        timeout: float | None = None,
        **selector: Any,
    ) -> ClaimedMessage:
        """Claim under a lease: a known ``message_id``, or the one message a selector matches.

        Without ``message_id`` this is ``wait_for`` (wait, then claim); with it, the message
        is claimed at once, or the refusal raised as its typed error.
        """
        __tracebackhide__ = True
        if message_id is None:
            return self.wait_for(timeout=timeout, lease=lease, **selector)
        if selector or timeout is not None:
            msg = "claim(message_id=...) takes no selector or timeout; the id names the message"
            raise ContractError(msg)
        _seconds("claim", "lease", lease)
        row = self.store.message(message_id)
        if row is None or row.mailbox_id != self.mailbox_id:
            msg = f"{message_id} is not a message of {self.address}"
            raise MailboxClosed(msg, status=Status.POLICY_DENIED, result={"message_id": message_id})
        outcome = self._raise_for(self._claim(row, lease), f"claim {message_id}")
        return ClaimedMessage(outcome.raw or b"", row, self, outcome)

    def ack(self, message_id: str, fence: int) -> Outcome:
        """Consume a claimed message; refused (typed error) for a stale fence or lease."""
        __tracebackhide__ = True
        return self._raise_for(
            self.store.ack(message_id, fence, mailbox=self._handle), f"ack {message_id}"
        )

    def renew(self, message_id: str, fence: int, lease: float | None = None) -> Outcome:
        """Extend a live lease under the same fence."""
        __tracebackhide__ = True
        _seconds("renew", "lease", lease)
        lease = self.contract.lease if lease is None else lease
        return self._raise_for(
            self.store.renew(message_id, fence, lease, mailbox=self._handle), f"renew {message_id}"
        )

    def release_claim(self, message_id: str, fence: int) -> Outcome:
        """Return a claimed message to ``waiting``."""
        __tracebackhide__ = True
        return self._raise_for(
            self.store.release_claim(message_id, fence, mailbox=self._handle),
            f"release {message_id}",
        )

    def release(self, reason: CloseReason | str = CloseReason.RELEASED_SUCCESS) -> Outcome:
        """End the reservation; every later operation on it is refused, a second release
        too (``MailboxClosed``, as every other call on a closed mailbox). ``reason``:
        ``released_success`` or ``released_error`` (a ``CloseReason`` or its value)."""
        __tracebackhide__ = True
        if reason not in _RELEASE_REASONS:
            allowed = " or ".join(repr(r.value) for r in _RELEASE_REASONS)
            msg = f"release: reason={reason!r} is invalid; allowed: {allowed}"
            raise ContractError(msg)
        reason = CloseReason(reason)
        self._ensure_open()
        outcome = self.store.release(self.mailbox_id, self.fence, reason)
        _LIVE.discard(self)
        if outcome.status is not Status.RELEASED:  # expired or re-fenced since the check
            self._raise_for(outcome, "release")
        return outcome

    def inject_fault(
        self, *, stage: str, reply: str = "451 4.3.0 Try again later", times: int = 1
    ) -> None:
        """Make the sink answer ``reply`` at ``stage`` for this alias only, ``times`` times.

        ``stage="RCPT"`` refuses the recipient, ``stage="DATA"`` refuses the whole message;
        either way nothing is stored, so a test can prove how the app retries or gives up.
        Every sink of the run honours it (faults live in the shared store).
        """
        __tracebackhide__ = True
        if stage not in ("RCPT", "DATA"):
            msg = f"inject_fault: stage={stage!r} is invalid; allowed: 'RCPT' or 'DATA'"
            raise ContractError(msg)
        if not isinstance(reply, str) or not _FAULT_REPLY.fullmatch(reply):
            msg = (
                f"inject_fault: reply={reply!r} is invalid; allowed: a 4xx or 5xx SMTP reply on "
                "one line of printable ASCII, e.g. '451 4.3.0 Try again later'"
            )
            raise ContractError(msg)
        if isinstance(times, bool) or not isinstance(times, int) or not 1 <= times <= 1000:
            msg = f"inject_fault: times={times!r} is invalid; allowed: an integer 1..1000"
            raise ContractError(msg)
        refused = self.store.add_fault(
            self.mailbox_id, self.fence, stage=stage, reply=reply, times=times
        )
        if refused is not None:
            self._raise_for(refused, "inject_fault")

    def close(self, *, success: bool) -> Receipt:
        """Teardown: ack (on success) or give back (on failure) live claims, release, receipt.

        A closed (or expired, or re-fenced) reservation is left as it is: the store refuses.
        """
        _LIVE.discard(self)
        if success:  # one transaction: the acks, the release and the receipt's reads
            _, history = self.store.release_and_read(
                self.mailbox_id, self.fence, CloseReason.RELEASED_SUCCESS, ack_for=self.run_id
            )
            return self._receipt(history)
        row = self.store.mailbox(self.mailbox_id)
        if row is not None and row.active and row.fence == self.fence:
            now = self.store.clock()
            for message in self.store.messages(self.mailbox_id):
                if (
                    message.leased(now)
                    and message.holder == self.run_id
                    and message.fence is not None
                ):
                    self.store.release_claim(
                        message.message_id, message.fence, mailbox=self._handle
                    )
            # Not self.release(): the mailbox may have expired since the check above, and
            # teardown must still leave the receipt (the store's refusal changes nothing).
            self.store.release(self.mailbox_id, self.fence, CloseReason.RELEASED_ERROR)
        else:
            self.did_not_pass(row)
        return self.receipt()

    def did_not_pass(self, row: MailboxRow | None = None) -> None:
        """The test did not pass: a release as ``released_success`` before now (by the
        test's code, or an agent's ``release_mailbox``) becomes ``released_error``, with a
        step that says why. A receipt never calls a failed test a success."""
        row = self.store.mailbox(self.mailbox_id) if row is None else row
        if row is not None and row.close_reason == CloseReason.RELEASED_SUCCESS.value:
            self.store.unpassed(self.mailbox_id, self.fence)

    def _record_secret(self, message_id: str) -> Callable[[str, str, str | None], None]:
        def record(kind: str, value: str, host: str | None) -> None:
            self._extracted.update(remember_extracted(kind, value))
            sha, last2 = self.store.digest(value)
            self.store.record_secret(
                self.mailbox_id, message_id, kind, sha, last2, host, len(value)
            )

        return record

    # -- receipt -----------------------------------------------------------------------

    def receipt(self) -> Receipt:
        """The secret-free record of this run so far."""
        return self._receipt(self.store.history(self.mailbox_id))

    def _receipt(self, history: History) -> Receipt:
        row = history.mailbox or self._row
        found = history.secrets
        digests = Recorded.of(found, self.store.digest)
        extracted = extracted_here(self._extracted)
        messages = [
            MessageReceipt(
                message_id=m.message_id,
                received_at=utc(m.received_at),
                subject=mask_subject(m.subject, digests, extracted),
                tag=mask_subject(mask_tag(m.tag), digests, extracted) if m.tag else None,
                state=m.state,
                fence=m.fence,
                claimed_at=utc(m.claimed_at) if m.claimed_at else None,
                consumed_at=utc(m.consumed_at) if m.consumed_at else None,
                secrets=[
                    SecretDigest(
                        kind=s["kind"], sha256=s["sha256"], last2=s["last2"], host=s["host"]
                    )
                    for s in found
                    if s["message_id"] == m.message_id
                ],
            )
            for m in history.messages
        ]
        return Receipt(
            run_id=row.run_id,
            nodeid=self.nodeid,
            mailbox_id=row.mailbox_id,
            address=row.address,
            purpose=row.purpose,
            state=row.state,
            close_reason=row.close_reason,
            fence=row.fence,
            created_at=utc(row.created_at),
            expires_at=utc(row.expires_at),
            released_at=utc(row.closed_at) if row.closed_at else None,
            messages=messages,
            events=[
                ReceiptEvent(
                    at=utc(e["at"]),
                    status=e["status"],
                    # A selector may hold a secret the run extracted later: masked here too.
                    detail=mask_subject(e["detail"], digests, extracted)
                    if e["status"] == Status.WAITING.value
                    else e["detail"],
                )
                for e in history.events
            ],
            evidence=self._agent.evidence() if self._agent is not None else None,
        )

    # -- agent surface -----------------------------------------------------------------

    def agent_tools(
        self, *, ttl_max: int | None = None, resend: Callable[[str], object] | None = None
    ) -> AgentTools:
        """Tools for an LLM agent bound to this run; their evidence joins the receipt.

        ``ttl_max`` caps the ttl an agent may ask for (default: the contract's ttl; what
        ``mailbox_ttl_max`` takes); ``resend(address)`` makes the app send its mail again,
        offered as ``request_resend``. A bad value raises ``ContractError`` here. See
        docs/agents.md.
        """
        __tracebackhide__ = True
        from pytest_mailbox.agent import AgentTools  # noqa: PLC0415 - agent imports this module

        self._agent = AgentTools(self, ttl_max=ttl_max, resend=resend)
        return self._agent


#: A blocking wait inside a coroutine: what the app sends from that loop never goes out.
_BLOCKED_LOOP = (
    "this wait blocked a thread that runs an event loop (an async test): mail sent by tasks "
    "on that loop could not go out while it waited; use "
    "`await isolated_mailbox.wait_for_async(...)`, which leaves the loop free"
)


#: What the async API needs to run on, and where the sync one goes instead.
_NO_LOOP = (
    "the async API (wait_for_async, expect_none_async, AgentTools.acall) runs on asyncio "
    "or trio (pytest-asyncio, anyio with either backend), and neither runs here; call "
    "wait_for, expect_none or call instead"
)


def running_trio() -> ModuleType | None:
    """None when the calling code runs on asyncio; trio when it runs in a trio task
    (anyio's trio backend); ``ContractError`` on neither."""
    if _loop_running():
        return None
    trio = sys.modules.get("trio")
    if trio is not None:
        try:
            trio.lowlevel.current_task()
        except RuntimeError:
            pass
        else:
            return trio
    raise ContractError(_NO_LOOP)


async def async_sleep(seconds: float) -> None:
    """``asyncio.sleep``, or ``trio.sleep`` in a trio task: by the machine's clock.

    Both sleep by the loop's clock, which freezegun freezes (asyncio's ``time.monotonic``,
    unless ``real_asyncio=True``; trio's ``time.perf_counter``, always): such a sleep never
    ends, and a wait that found nothing never reached its timeout. Then the sleep is a
    thread's, which the loop awaits (and leaves behind if cancelled: a poll is short)."""
    trio = running_trio()
    if not faked():
        await (asyncio.sleep(seconds) if trio is None else trio.sleep(seconds))
    elif trio is None:
        await asyncio.get_running_loop().run_in_executor(None, time.sleep, seconds)
    else:
        await trio.to_thread.run_sync(time.sleep, seconds, abandon_on_cancel=True)


def _loop_running() -> bool:
    """True when called from code that an event loop in this thread is running."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _polls() -> Iterator[float]:
    """The pauses between two looks at the store during one wait: ``POLL_FIRST``, twice as
    long each time, then ``POLL_INTERVAL`` for as long as the wait lasts (a look that finds
    news and scans again does not start it over)."""
    interval = POLL_FIRST
    while True:
        yield interval
        interval = min(interval * 2, POLL_INTERVAL)


def _keywords_only(call: str, positional: tuple[object, ...]) -> None:
    """Refuse a positional argument naming the keywords, where Python's TypeError said only
    that the call "takes 1 positional argument but 2 were given" (``self`` counted). The
    value is not quoted: a selector's value may be a code."""
    __tracebackhide__ = True
    if positional:
        own = _WAIT_OWN if call == "wait_for" else _NONE_OWN
        msg = (
            f"{call} takes keyword arguments only, e.g. {_KEYWORDS_ONLY[call]}; "
            f"allowed fields: {', '.join(SELECTOR_FIELDS)}{own}"
        )
        raise ContractError(msg)
