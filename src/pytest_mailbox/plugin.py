"""pytest wiring only: options, the marker, fixtures and receipts in reports.

PYTEST_DONT_REWRITE, as the package says (a conftest's ``pytest_plugins`` names this module).
"""

from __future__ import annotations

import codecs
import contextlib
import html
import os
import re
import sys
import types
import uuid
import warnings
import weakref
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

import pytest
from _pytest import junitxml  # its stash key: JUnit takes properties at teardown only
from _pytest._code.code import TerminalRepr

from pytest_mailbox.endpoint import (
    Signal,
    SinkError,
    SmtpEndpoint,
    address,
    check_host,
    ip_of,
    is_loopback,
)
from pytest_mailbox.errors import ExposedSinkWarning, StoreError
from pytest_mailbox.receipts import RECEIPT_PROPERTY, parse_receipt, printable
from pytest_mailbox.settings import OPTIONS, Settings
from pytest_mailbox.vocabulary import CONTRACT_FIELDS

if TYPE_CHECKING:
    # Imported where they are used: the xdist controller runs no test and no sink, so it
    # never imports asyncio, aiosmtpd, the store or the mailbox (start-up before workers),
    # and a run none of whose tests resolves a contract never imports pydantic.
    from _pytest.nodes import Node

    from pytest_mailbox.contract import EmailContract, Receipt
    from pytest_mailbox.mailbox import Mailbox
    from pytest_mailbox.sink import MailSink
    from pytest_mailbox.store import Store

STORE_NAME = "pytest-mailbox.sqlite3"

_settings_key = pytest.StashKey[Settings]()
#: pytest 9.2+ reads a number in a native TOML table (``[tool.pytest]``, ``mailbox_ttl =
#: 120``) as itself; ini files and ``-o`` give strings. Older pytest takes strings only.
_INI_TYPE: Any = (str | int | float) if pytest.version_tuple >= (9, 2) else "string"
_store_path_key = pytest.StashKey[Path]()
_signal_key = pytest.StashKey[Signal]()
_mailboxes_key = pytest.StashKey["list[Mailbox]"]()
#: This attempt's mailboxes closed at their teardown, with the receipt property each left,
#: until the teardown's report: a later fixture's teardown may still fail the test.
_closed_key = pytest.StashKey["list[tuple[Mailbox, tuple[str, str]]]"]()
_failed_key = pytest.StashKey[bool]()
_passed_key = pytest.StashKey[bool]()
_in_call_key = pytest.StashKey[bool]()
#: The test's teardown began: an interrupt in it left its fixtures' finalizers half run.
_teardown_began_key = pytest.StashKey[bool]()
#: The test's setup was reported: an interrupt in its setup leaves no report of it.
_setup_reported_key = pytest.StashKey[bool]()
#: The receipts the test attached that no teardown report has carried yet, and those one has.
_attached_key = pytest.StashKey["list[tuple[str, object]]"]()
_carried_key = pytest.StashKey["list[tuple[str, object]]"]()
_fixed_sink_key = pytest.StashKey["MailSink"]()
_stats_key = pytest.StashKey[dict[str, int]]()
_foreign_key = pytest.StashKey[str]()  # another run shares the store: said at the end
_store_failed_key = pytest.StashKey[str]()  # the run's end could not use the store: said too
_reported_key = pytest.StashKey["_Reported"]()  # what the reports said of the mailboxes
_run_key = pytest.StashKey[str]()  # the plugin's own id of this pytest run
_RUN_INPUT = "pytest_mailbox_run"  # its key in an xdist worker's workerinput
_testrun_key = pytest.StashKey[str]()
_fixtures_key = pytest.StashKey["_Fixtures"]()
#: A test's contract as its setup found it: its marker's, checked; None, no marker (the
#: settings' contract, built once a fixture asks for it).
_contract_key = pytest.StashKey["EmailContract | None"]()
#: What the process masked for its running test when this session began: a session run
#: inside a test (pytester's in-process runs) gives it back to that test at its end.
_outer_extracted_key = pytest.StashKey["frozenset[str]"]()
_session_store_key = pytest.StashKey["Store"]()  # the mailbox_store fixture's handle


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("mailbox", "pytest-mailbox: an isolated SMTP mailbox per test")
    for option in OPTIONS:
        # What it allows, here too: --help is where one reads it. An empty default is none
        # (the help says what stands in for it), not a value of ''.
        default = f"; default {option.default!r}" if option.default else ""
        group.addoption(
            option.flag,
            dest=f"mailbox_{option.name}",
            default=None,
            metavar=option.name.upper(),
            help=f"{option.help} (allowed: {option.allowed}; ini {option.ini}, env {option.env}"
            f"{default})",
        )
        parser.addini(
            option.ini, f"{option.help} (allowed: {option.allowed})", _INI_TYPE, default=None
        )


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.is_blocked("mailbox"):
        # -p no:mailbox, where the module was named too (a conftest's pytest_plugins, as
        # docs/configuration.md says to load it without autoload, or -p): off, as the
        # entry point's name promises, not on under the module's name. Its options stay
        # known (pytest asked for them when it loaded the module). Found by this very
        # hook: pytester's runs may have imported the module anew since.
        manager = config.pluginmanager
        for plugin in manager.get_plugins():
            if getattr(plugin, "pytest_configure", None) is pytest_configure:
                manager.unregister(plugin)
        return
    message = sys.modules.get("pytest_mailbox.message")
    if message is not None:
        config.stash[_outer_extracted_key] = frozenset(message.TEST_EXTRACTED)
    config.addinivalue_line(
        "markers",
        "email_contract(*, purpose='mail', ttl=min(300, mailbox_ttl_max), lease=min(60, ttl), "
        "timeout=10, max_reads=3, max_resends=1, mode='live', link_domains=(), "
        "run_header='X-Run-Id'): the rules of this test's isolated_mailbox; the closest marker "
        "counts, over the mailbox_* settings (--mailbox-* options, PYTEST_MAILBOX_* variables, "
        "ini keys), which give the defaults",
    )
    try:
        settings = Settings.resolve(
            cli={o.name: config.getoption(f"mailbox_{o.name}") for o in OPTIONS},
            ini={o.name: _ini_value(config, o.ini) for o in OPTIONS},
            ini_keys=_ini_keys(config),
            ini_dir=config.inipath.parent if config.inipath is not None else None,
            override_ini=config.getoption("override_ini", None) or (),
        )
    except ValueError as exc:
        msg = f"pytest-mailbox: {exc}"
        if config.getoption("help", False):
            # Help is what one reads to mend it: show it, and the fault, to stderr (a
            # warning would be an error under filterwarnings=error). The plugin stays off.
            sys.stderr.write(f"ERROR: {msg}\n")
            return
        raise pytest.UsageError(msg) from None
    if not is_loopback(settings.host) and not _is_worker(config):
        _warn_exposed(config, settings.host)
    config.stash[_settings_key] = settings
    config.stash[_signal_key] = Signal()
    config.stash[_fixtures_key] = fixtures = _Fixtures(config)
    config.pluginmanager.register(fixtures.plugin(), "mailbox-fixtures")
    config.pluginmanager.register(_MarkerCheck(settings), "mailbox-marker")
    config.pluginmanager.register(_ShownOutput(), "mailbox-shown-output")
    # One id for the whole pytest run, shared by its xdist workers; kept in every receipt.
    workerinput: dict[str, str] = getattr(config, "workerinput", {})
    config.stash[_testrun_key] = workerinput.get("testrunuid") or uuid.uuid4().hex
    # And the plugin's own, which the controller hands its workers (pytest_configure_node):
    # recorded with every mailbox, so that a run's end closes only its own. xdist's may be
    # given on the command line, the same for two runs.
    config.stash[_run_key] = workerinput.get(_RUN_INPUT) or uuid.uuid4().hex
    if settings.receipts is not None and not _is_worker(config):
        if not _holds_receipts(settings.receipts):
            # The run empties it: a test module that `--mailbox-receipts test_x.py` (its
            # value forgotten) took for the path was emptied, its tests never run.
            source = settings.sources["receipts"]
            msg = (
                f"pytest-mailbox: {source}={str(settings.receipts)!r} holds something other "
                "than receipts, and the run would empty it; give a new file or a receipts "
                "file, such as receipts.jsonl"
            )
            if source == next(o.flag for o in OPTIONS if o.name == "receipts"):
                msg += (
                    " (the option takes the word after it as its value: write "
                    "--mailbox-receipts=receipts.jsonl)"
                )
            raise pytest.UsageError(msg)
        try:
            writer = _ReceiptWriter(settings.receipts)
        except OSError as exc:  # a parent that is a file, a read-only place, …
            msg = (
                f"pytest-mailbox: --mailbox-receipts={str(settings.receipts)!r} cannot be "
                f"written ({exc.strerror or type(exc).__name__}); give a file path in a "
                "writable directory"
            )
            raise pytest.UsageError(msg) from None
        config.pluginmanager.register(writer, "mailbox-receipts")
    # Only for a report asked for: pytest-html installed alone would parse every receipt.
    html_report = config.getoption("htmlpath", None)
    if config.pluginmanager.hasplugin("html") and html_report and not _is_worker(config):
        config.pluginmanager.register(_HtmlReceipts(), "mailbox-html")
    if _is_controller(config):
        config.pluginmanager.register(_CrashReceipts(config), "mailbox-crashes")
    if not _is_worker(config):
        config.stash[_reported_key] = reported = _Reported()
        config.pluginmanager.register(reported, "mailbox-reported")
        config.pluginmanager.register(_ShownSections(), "mailbox-shown-sections")


def pytest_unconfigure(config: pytest.Config) -> None:
    """The session is over: its stores are retired, so that a mailbox or a store kept from
    it refuses in a later session of the process (``pytest.main`` again) instead of
    opening the old file again. Not at the fixture's teardown: the last test's teardown
    report, which comes after it, may still amend a receipt there.

    A session run inside a test (``pytester.runpytest``, ``inline_run``) emptied, at
    each of its tests' setup, what the process masks for the running test: the test that
    ran it gets its values back (with the inner ones: masking more is safe)."""
    stores = [config.stash.get(_session_store_key, None)]
    if _fixed_sink_key in config.stash:
        sink = config.stash[_fixed_sink_key]
        # Stopped at pytest_sessionfinish, which pytest skips for a session that ended in
        # an error raised after this plugin's pytest_sessionstart (another plugin's, a
        # hook wrapper's): the sink would serve a retired store, and hold the port for the
        # rest of the process (the next pytest.main could not bind it). Idempotent.
        sink.stop()
        stores.append(sink.store)
    for store in stores:
        if store is not None:
            store.retire(_ended(store))
    outer = config.stash.get(_outer_extracted_key, frozenset())
    message = sys.modules.get("pytest_mailbox.message")
    if outer and message is not None:
        message.TEST_EXTRACTED.update(outer)


def pytest_report_header(config: pytest.Config) -> str:
    settings = config.stash[_settings_key]
    where = address(settings.host, settings.port or "a free port per worker")
    return f"mailbox: {settings.domain} on {where}, ttl_max {settings.ttl_max}s"


def _ini_keys(config: pytest.Config) -> list[str]:
    """Every key of the ini file (pytest 9 keeps them in ``_inicfg``, pytest 8 in ``inicfg``)."""
    found = config.__dict__.get("_inicfg", config.__dict__.get("inicfg", {}))
    return [str(key) for key in found]


def _ini_value(config: pytest.Config, key: str) -> object:
    """``getini``, but a TOML value that is no string or number as it is: a list, which
    pytest 9.2 registers no type to take beside a string in ``[tool.pytest]`` (Settings
    checks which settings take one), and a boolean, a date or a table, which pytest would
    refuse without saying what the setting allows (Settings does)."""
    raw = getattr(config.__dict__.get("_inicfg", {}).get(key), "value", None)
    plain = raw is None or (isinstance(raw, str | int | float) and not isinstance(raw, bool))
    return config.getini(key) if plain else raw


def _warn_exposed(config: pytest.Config, host: str) -> None:
    """A sink off loopback takes mail from other machines: say so, once, on the controller."""
    warning = ExposedSinkWarning(
        f"pytest-mailbox: the SMTP sink is set to listen on {host} (mailbox_host), not on "
        "loopback: other machines can connect and send mail into this run. Keep 127.0.0.1 "
        "unless the app under test runs elsewhere (a container); then acknowledge it with "
        "-W 'ignore::pytest_mailbox.ExposedSinkWarning'"
    )
    try:
        config.issue_config_time_warning(warning, stacklevel=2)
    except ExposedSinkWarning as exc:  # -W error (or filterwarnings) made it an error
        raise pytest.UsageError(str(exc)) from None


def _is_worker(config: pytest.Config) -> bool:
    return hasattr(config, "workerinput")


def _is_controller(config: pytest.Config) -> bool:
    """xdist distributes this run's tests to workers (``--dist`` without ``-n`` or ``--tx``
    runs them here, as xdist's own check says)."""
    distributed = getattr(config.option, "dist", "no") != "no"
    return distributed and bool(getattr(config.option, "tx", None)) and not _is_worker(config)


def _worker_name(config: pytest.Config) -> str:
    workerinput: dict[str, str] = getattr(config, "workerinput", {})
    return workerinput.get("workerid", "main")


def store_path(config: pytest.Config, factory: pytest.TempPathFactory) -> Path:
    """One store per pytest run: the controller's basetemp, shared by every xdist worker."""
    base = factory.getbasetemp()
    return (base.parent if _is_worker(config) else base) / STORE_NAME


def _new_sink(config: pytest.Config, store: Store, port: int) -> MailSink:
    from pytest_mailbox.sink import MailSink  # noqa: PLC0415 - see TYPE_CHECKING above

    settings = config.stash[_settings_key]
    return MailSink(
        store,
        domains=settings.allowed_domains,
        host=settings.host,
        port=port,
        max_message_size=settings.max_message_size,
        max_recipients=settings.max_recipients,
        idle_timeout=settings.idle_timeout,
        data_policy=settings.data_policy,
        signal=config.stash[_signal_key],
        name=_worker_name(config),
    )


#: The fixtures that need the sink and the mailbox modules (asyncio, aiosmtpd, the store).
_SINK_FIXTURES = frozenset({"mailbox_store", "mailbox_server", "isolated_mailbox"})


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A process that will run a test using the sink imports it now, once collected: not
    inside that test's setup, where a per-test timeout would count about 0.1 s of imports.
    A run none of whose tests asks for a mailbox (and the xdist controller, which runs no
    test) never imports them."""
    if _is_controller(config) or config.option.collectonly:
        return
    if any(not _SINK_FIXTURES.isdisjoint(getattr(i, "fixturenames", ())) for i in items):
        import pytest_mailbox.mailbox  # noqa: PLC0415 - see TYPE_CHECKING above
        import pytest_mailbox.sink  # noqa: F401, PLC0415


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Fixed-port mode: the process that outlives every test serves the port for the run.

    That is the xdist controller (or the only process), so a worker that finishes early
    never takes the port, or mail in flight, with it. Otherwise, each worker's sink binds
    a free port of its own: the host is tried once here, so that one this machine cannot
    listen on stops the run (a usage error) before any test.
    """
    config = session.config
    settings = config.stash[_settings_key]
    # A run that only lists binds nothing and makes no store: an IDE's discovery lists
    # beside a suite that holds the fixed port, or on a machine that has no such host.
    if _is_worker(config) or _lists_only(config):
        return
    if settings.port == 0:  # each worker's sink binds a free port: try the host once here
        try:
            check_host(settings.host)
        except SinkError as exc:
            raise pytest.UsageError(str(exc)) from None
        return
    path = store_path(config, _needed_tmp_path_factory(config))
    config.stash[_store_path_key] = path
    from pytest_mailbox.store import Store  # noqa: PLC0415 - see TYPE_CHECKING above

    try:
        store = Store(path)
    except StoreError as exc:  # a path too long for SQLite: what to change, not a traceback
        msg = f"pytest-mailbox: {exc}"
        raise pytest.UsageError(msg) from None
    sink = _new_sink(config, store, settings.port)
    try:
        sink.start()
    except SinkError as exc:
        sink.store.close()
        raise pytest.UsageError(str(exc)) from None
    config.stash[_fixed_sink_key] = sink


def _tmp_path_factory(config: pytest.Config) -> pytest.TempPathFactory | None:
    """pytest's basetemp, where the run's store lives; None under ``-p no:tmpdir``."""
    factory: pytest.TempPathFactory | None = getattr(config, "_tmp_path_factory", None)
    return factory


def _run_store_path(config: pytest.Config) -> Path | None:
    """Where the run's store lives in pytest's basetemp; None under ``-p no:tmpdir``."""
    factory = _tmp_path_factory(config)
    return None if factory is None else store_path(config, factory)


def _needed_tmp_path_factory(config: pytest.Config) -> pytest.TempPathFactory:
    """pytest's basetemp, or a usage error that names the fix."""
    factory = _tmp_path_factory(config)
    if factory is None:
        msg = (
            "pytest-mailbox keeps its store in pytest's basetemp, which -p no:tmpdir turns "
            "off: drop -p no:tmpdir, or pass -p no:mailbox for a run without mailboxes"
        )
        raise pytest.UsageError(msg)
    return factory


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> None:
    """Every test is over: stop the fixed-port sink; close what this run left open (a
    crashed worker's mailboxes: ``orphaned``, then ``released_error``, or ``expired``).
    First: pytest's tmpdir plugin may remove the basetemp, store included, in its own
    (``tmp_path_retention_policy = "failed"`` after a run that passed).

    A run whose end could not use its store is no green run: its mailboxes' leases and
    claims were left as they were, and the counts are missing. Its exit status becomes 3
    (pytest's ``INTERNAL_ERROR``: the harness failed, not a test) if it would have been 0;
    one that already says what went wrong (failed tests, an interrupt) stays."""
    config = session.config
    try:
        if _is_controller(config):
            # Whatever ended the loop: an interrupt, pytest.exit(returncode=...) in a
            # hook, an internal error. After a run that went to its end, they are down.
            _stop_workers(config)
    finally:  # a second interrupt while they stop: the bookkeeping still runs
        _finish(config)
        if _store_failed_key in config.stash and session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.INTERNAL_ERROR


def _finish(config: pytest.Config) -> None:
    sink = config.stash.get(_fixed_sink_key, None)
    if sink is not None:
        sink.stop()
        sink.store.close()
    if _is_worker(config):
        return
    path = config.stash.get(_store_path_key, None)
    if path is None and _is_controller(config):
        # xdist created the basetemp that its workers share; their store lives there.
        path = _run_store_path(config)
    if path is None or not path.exists():
        if path is not None and _made_store(config):
            # Here only: a run that made no store (most, in a project's other suites)
            # never imports it, nor sqlite3 and filelock.
            from pytest_mailbox.store import REMOVED  # noqa: PLC0415 - see TYPE_CHECKING

            config.stash[_store_failed_key] = (
                f"mailbox: the end of the run could not open its store: {path} is gone: "
                f"{REMOVED}; the mailboxes its tests left open were not closed"
            )
        return
    from pytest_mailbox.store import Store  # noqa: PLC0415 - see TYPE_CHECKING above

    run = config.stash[_run_key]
    store: Store | None = None
    step = "open its store"
    try:
        store = Store(path)
        step = "close the mailboxes its tests left open"
        store.close_orphans(testrun=run)
        step = "close the expired mailboxes and claims"
        store.reconcile()
        step = "count its mailboxes"
        stats = store.stats(testrun=run)
        reported = config.stash.get(_reported_key, None)
        named = len(reported.mailboxes) if reported is not None else 0
        if stats["reserved"] < named:
            # Its rows are gone: another run emptied the basetemp, or a cleanup removed the
            # file and a worker that opened the store later made it again, empty. As a
            # store gone at the end: what was left open there was not closed.
            config.stash[_store_failed_key] = (
                f"mailbox: {store.path} holds {stats['reserved']} of the {named} mailboxes "
                "this run's reports name: it was removed or replaced while the run used it "
                "(another pytest run given the same --basetemp, a cleanup), so this run's "
                "mailboxes are not counted, and those its tests left open were not closed "
                "(their receipts, in the reports, are whole): give each run its own "
                "--basetemp"
            )
        else:
            config.stash[_stats_key] = stats
        step = "check whether another run shares its store"
        if store.other_runs(run) and _store_failed_key not in config.stash:
            config.stash[_foreign_key] = (
                f"mailbox: another pytest run shares {store.path} (two runs were given one "
                "--basetemp); this run closed and counted only its own mailboxes: give each "
                "run its own --basetemp"
            )
    except StoreError as exc:  # a process stopped inside a write holds it, say: no traceback
        config.stash[_store_failed_key] = f"mailbox: the end of the run could not {step}: {exc}"
    finally:
        if store is not None:
            store.close()


def _ended(store: Store) -> str:
    """What a call on a store whose session has ended says, and what to use instead."""
    return (
        f"the store {store.path} served a pytest session that has ended: a mailbox, message, "
        "agent toolset or store kept from it (in a module's global, a notebook's variable) "
        "is not this session's; use this session's isolated_mailbox (or mailbox_store)"
    )


def _made_store(config: pytest.Config) -> bool:
    """This run made its store: here (a fixture or the fixed-port sink asked for it), or
    in a worker whose report named a mailbox."""
    reported = config.stash.get(_reported_key, None)
    return _store_path_key in config.stash or bool(reported and reported.mailboxes)


def _stop_workers(config: pytest.Config) -> None:
    """The controller's loop can end while the workers still run their tests: an interrupt
    that reached the controller alone (``kill -INT`` of its pid, an IDE's stop button;
    Ctrl-C reaches every process of the group), a hook's ``pytest.exit(returncode=...)``,
    an internal error. They are ended first, as xdist's own session end would end them
    after this hook (each is asked, then killed after xdist's timeout), so that none
    reserves a mailbox, or sends mail to the fixed port, after the run's bookkeeping.
    After a run that went to its end they are down already; xdist's own call is then a
    no-op."""
    nodemanager = getattr(config.pluginmanager.getplugin("dsession"), "nodemanager", None)
    if nodemanager is not None:
        nodemanager.teardown_nodes()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist's controller starts a worker: it gets the run's own id (see ``_run_key``)."""
    node.workerinput[_RUN_INPUT] = node.config.stash[_run_key]


class _Fixtures:
    """The plugin's fixtures, bound to one pytest config.

    They take neither ``request`` nor ``pytestconfig``: pytest builds a new FixtureDef (and
    inspects a signature) for ``request`` each time a fixture that depends on it is resolved,
    which, through the session fixtures' chain, was every test, about 0.3 ms each. So they
    are closures over this object, in a module registered as a plugin for this config.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.item: pytest.Item | None = None  # the test being set up or run

    def test(self) -> pytest.Item:
        if self.item is None:  # pragma: no cover - pytest sets up fixtures inside a test
            msg = "pytest-mailbox fixtures are available inside a test only"
            raise RuntimeError(msg)
        return self.item

    def plugin(self) -> types.ModuleType:
        """The fixtures, as a plugin module of plain functions that read this object (pytest
        deprecates fixtures that are methods of an instance)."""
        state = self

        def mailbox_store() -> Iterator[Store]:
            yield from state.mailbox_store()

        def mailbox_server(mailbox_store: Store) -> Iterator[SmtpEndpoint]:
            yield from state.mailbox_server(mailbox_store)

        def email_contract() -> EmailContract:
            return state.email_contract()

        def isolated_mailbox(
            mailbox_server: SmtpEndpoint, mailbox_store: Store, email_contract: EmailContract
        ) -> Iterator[Mailbox]:
            yield from state.isolated_mailbox(mailbox_server, mailbox_store, email_contract)

        module = types.ModuleType(f"{__name__}.fixtures")
        module.__file__ = __file__
        for function, scope in (
            (mailbox_store, "session"),
            (mailbox_server, "session"),
            (email_contract, "function"),
            (isolated_mailbox, "function"),
        ):
            function.__doc__ = getattr(self, function.__name__).__doc__  # `pytest --fixtures`
            setattr(module, function.__name__, pytest.fixture(scope=scope)(function))  # type: ignore[call-overload]
        return module

    def mailbox_store(self) -> Iterator[Store]:
        """The run's shared store (SQLite, WAL), reconciled when the session starts and ends."""
        config = self.config
        path = store_path(config, _needed_tmp_path_factory(config))
        config.stash[_store_path_key] = path
        from pytest_mailbox.store import Store  # noqa: PLC0415 - see TYPE_CHECKING above

        store = Store(path, worker=_worker_name(config), testrun=config.stash[_run_key])
        store.reconcile()
        config.stash[_session_store_key] = store  # retired once the session is over
        yield store
        store.reconcile()
        store.close()

    def mailbox_server(self, mailbox_store: Store) -> Iterator[SmtpEndpoint]:
        """The SMTP endpoint for the app under test: ``host``, ``port``, ``smtp_url``,
        ``settings``.

        A sink per worker on a free port; with ``--mailbox-port``, the one sink serving that
        port.
        """
        config = self.config
        port = config.stash[_settings_key].port
        if port:
            fixed = config.stash.get(_fixed_sink_key, None)
            yield fixed or SmtpEndpoint(config.stash[_settings_key].host, port)
            return
        sink = _new_sink(config, mailbox_store, 0)
        try:
            sink.start()
            problem = None
        except SinkError as exc:
            problem = str(exc)
        if problem is not None:  # what to change, not a traceback through the sink
            pytest.fail(problem, pytrace=False)
        try:
            yield sink
        finally:
            sink.stop()

    def email_contract(self) -> EmailContract:
        """This test's EmailContract: the mailbox_* settings (--mailbox-* options,
        PYTEST_MAILBOX_* variables, ini keys), overlaid by its closest email_contract marker."""
        item = self.test()
        settings = self.config.stash[_settings_key]
        if _contract_key not in item.stash:  # -p no:mailbox-marker: no check at setup
            return _contract_for(item.get_closest_marker("email_contract"), settings)
        contract = item.stash[_contract_key]
        return settings.contract if contract is None else contract

    def isolated_mailbox(
        self, mailbox_server: SmtpEndpoint, mailbox_store: Store, email_contract: EmailContract
    ) -> Iterator[Mailbox]:
        """A Mailbox of this test's own: a fresh alias on the session's sink, under its
        email_contract. Released at teardown (its live claims acked if the test passed, given
        back if not), its receipt attached to the test's report."""
        # mailbox_server only orders the fixtures: the sink is up first.
        from pytest_mailbox.mailbox import Mailbox  # noqa: PLC0415 - see TYPE_CHECKING above

        config, item = self.config, self.test()
        mailbox = Mailbox.reserve(
            mailbox_store,
            contract=email_contract,
            domain=config.stash[_settings_key].domain,
            nodeid=_stored_id(item.nodeid),
            signal=config.stash[_signal_key],
            ttl_max=config.stash[_settings_key].ttl_max,
        )
        opened = item.stash.setdefault(_mailboxes_key, [])
        opened.append(mailbox)
        yield mailbox
        if mailbox not in opened:  # closed as its test's teardown was stopped; pytest's
            return  # session end tears down what that stopped teardown left
        # Success is a call that passed: not a failure, an xfail or a skip in the middle of
        # the test, nor a call that never ended (Ctrl-C, pytest.exit) or never ran.
        passed = item.stash.get(_passed_key, False) and not item.stash.get(_failed_key, False)
        _close(item, mailbox, success=passed)


def _close(item: pytest.Item, mailbox: Mailbox, *, success: bool) -> tuple[str, object]:
    """Close one of the test's mailboxes, and attach its receipt to the test (returned)."""
    from pytest_mailbox.contract import dump_receipt  # noqa: PLC0415 - see TYPE_CHECKING

    receipt = mailbox.close(success=success).model_copy(
        update={"testrun_uid": item.config.stash[_testrun_key]}
    )
    attached = (RECEIPT_PROPERTY, dump_receipt(receipt))
    item.user_properties.append(attached)
    item.stash.setdefault(_attached_key, []).append(attached)
    item.stash.setdefault(_closed_key, []).append((mailbox, attached))
    item.stash[_mailboxes_key].remove(mailbox)
    return attached


def _close_left_open(item: pytest.Item) -> list[tuple[str, object]]:
    """Close the test's mailboxes still open, as no success; the receipts attached."""
    attached = []
    opened: list[Mailbox] = item.stash.get(_mailboxes_key, [])
    for mailbox in list(opened):
        try:
            with _kept_closed(mailbox.store):
                attached.append(_close(item, mailbox, success=False))
        except StoreError:  # the store failed under it: the run's end closes what it can
            continue
    return attached


@contextlib.contextmanager
def _kept_closed(store: Store) -> Iterator[None]:
    """Use ``store`` and leave it closed if it was: the last test's teardown closes the
    session's store first, and what a use after opens again is closed again here (Python
    3.13 warns of a connection left to the collector)."""
    reopened = store.closed
    try:
        yield
    finally:
        if reopened:
            store.close()


def _stored_id(nodeid: str) -> str:
    """A test's node id as SQLite and JSON take it. pytest builds it from the test's path,
    which Python decodes with surrogates where a name is not in the file system's encoding
    (``café`` under ``LC_ALL=C`` without UTF-8 mode is ``caf\\udcc3\\udca9``), and neither
    takes a lone surrogate: the name's bytes are read as UTF-8 (``café``), escaped if not."""
    try:
        nodeid.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return nodeid.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate no decoding makes
            return nodeid.encode("utf-8", "backslashreplace").decode("utf-8")
    return nodeid


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Each run of a test starts clean, reruns included (pytest-rerunfailures): an earlier
    attempt's receipts that its teardown report carried leave ``user_properties``, which
    the item keeps across attempts. Those no report carried stay for the next one: a
    plugin that sets the test up again without reporting the attempt before (pytest-retry)
    would lose them."""
    for attached in item.stash.get(_carried_key, []):
        item.user_properties[:] = [p for p in item.user_properties if p is not attached]
    item.stash[_carried_key] = []
    item.stash.setdefault(_attached_key, [])
    item.stash[_failed_key] = False
    item.stash[_passed_key] = False
    item.stash[_teardown_began_key] = False
    item.stash[_setup_reported_key] = False
    item.stash[_mailboxes_key] = []
    item.config.stash[_fixtures_key].item = item
    message = sys.modules.get("pytest_mailbox.message")
    if message is not None:  # what the last test extracted masks its reports only
        message.TEST_EXTRACTED.clear()


def _contract_for(marker: pytest.Mark | None, settings: Settings) -> EmailContract:
    """A test's contract: the mailbox_* settings, overlaid by its closest
    email_contract ``marker``; an invalid marker fails the test, naming the field."""
    if marker is None:
        return settings.contract
    contract = _checked(marker, settings)
    if isinstance(contract, str):
        pytest.fail(contract, pytrace=False)
    return contract


def _checked(marker: pytest.Mark, settings: Settings) -> EmailContract | str:
    """The contract ``marker`` overlays on the settings, or what is wrong with it."""
    if marker.args:
        return (
            "email_contract takes keyword arguments only, "
            "e.g. @pytest.mark.email_contract(purpose='signup', ttl=60); "
            f"allowed fields: {', '.join(CONTRACT_FIELDS)}"
        )
    from pydantic import ValidationError  # noqa: PLC0415 - see TYPE_CHECKING above

    from pytest_mailbox.contract import EmailContract, describe_validation_error  # noqa: PLC0415

    # What the settings were given, not their defaults: ttl=30 here takes the default lease
    # capped at 30, while an ini lease of 60 stays, and is refused naming both sources.
    values = {**settings.contract_given, **dict(marker.kwargs)}
    try:
        contract = EmailContract(**values)
        sources = {**settings.sources, **dict.fromkeys(marker.kwargs, "marker")}
        contract.check_limits(ttl_max=settings.ttl_max, sources=sources)
    except ValidationError as exc:
        return describe_validation_error("email_contract", exc, CONTRACT_FIELDS)
    except ValueError as exc:
        return str(exc)
    return contract


def _shown(marker: pytest.Mark) -> str:
    """``email_contract(purpose='signup', ttl=5)``: a marker as the test wrote it."""
    given = [repr(arg) for arg in marker.args]
    given += [f"{name}={value!r}" for name, value in marker.kwargs.items()]
    return f"email_contract({', '.join(given)})"


def _markers(item: pytest.Item) -> list[tuple[str, pytest.Mark]]:
    """The item's email_contract markers, the closest first, each with where it was put:
    the test, then its classes (a class's own before those it inherits, the nearest base
    first, where pytest lists a base's first), then its module and packages."""
    by_node: dict[Node, list[tuple[int, str, pytest.Mark]]] = {}
    for node, marker in item.iter_markers_with_node("email_contract"):
        depth, where = 0, _where(node)
        cls = getattr(node, "obj", None) if isinstance(node, pytest.Class) else None
        if isinstance(cls, type):
            depth = next((d for d, base in enumerate(cls.__mro__) if _puts(base, marker)), 0)
            if depth:
                where += f" (from its base class {cls.__mro__[depth].__qualname__})"
        by_node.setdefault(node, []).append((depth, where, marker))
    return [
        (where, marker)
        for entries in by_node.values()
        for _, where, marker in sorted(entries, key=lambda entry: entry[0])  # stable
    ]


def _puts(cls: type, marker: pytest.Mark) -> bool:
    """``cls`` itself carries ``marker`` (not by inheritance)."""
    marks = cls.__dict__.get("pytestmark", [])
    return any(
        getattr(m, "mark", m) == marker for m in (marks if isinstance(marks, list) else [marks])
    )


def _given(marker: pytest.Mark) -> str:
    return repr((marker.args, sorted(marker.kwargs.items())))


def _where(node: Node) -> str:
    kind = "module" if isinstance(node, pytest.Module) else type(node).__name__.lower()
    return f"{kind} {node.nodeid or node.name}"


class _MarkerCheck:
    """Every test's email_contract marker is checked at its setup, whether the test asks for
    the fixture or not: a typo (``purpse=``) must not pass silently.

    A plugin of its own, at the default priority, so that it runs after pytest has applied
    the skip and xfail marks (a skipped test is not checked, as its fixture would not be
    resolved) and before any fixture is set up.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        # By marker: a module's pytestmark, or a parametrized test's, is one Mark for all.
        self._contracts: dict[int, tuple[pytest.Mark, EmailContract | str]] = {}

    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        found = _markers(item)
        if not found:  # the settings' contract, built once a fixture asks for it
            item.stash[_contract_key] = None
            return
        for where in dict.fromkeys(where for where, _ in found):
            mine = {_given(m): m for place, m in found if place == where}  # repeats are one
            if len(mine) > 1:  # which one counts would be a guess
                pytest.fail(
                    f"email_contract: {len(mine)} markers on {where}: "
                    f"{'; '.join(map(_shown, reversed(mine.values())))}; only one counts, "
                    "so give it one marker with the whole contract (a parametrized case that "
                    "needs its own takes it in pytest.param(..., marks=...), and the test none; "
                    "a hook that adds one as a default adds it where get_closest_marker finds "
                    "none)",
                    pytrace=False,
                )
        closest: EmailContract | None = None
        for where, marker in found:
            contract = self._checked(marker)
            if isinstance(contract, str):
                # One that a closer marker overrides is checked too: its typo is a typo.
                if marker is not found[0][1]:
                    contract += f" (in {_shown(marker)} on {where})"
                pytest.fail(contract, pytrace=False)
            if closest is None:
                closest = contract
        item.stash[_contract_key] = closest

    def _checked(self, marker: pytest.Mark) -> EmailContract | str:
        known = self._contracts.get(id(marker))
        if known is None or known[0] is not marker:
            known = (marker, _checked(marker, self.settings))
            self._contracts[id(marker)] = known
        return known[1]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    """``pytest.exit()`` or Ctrl-C inside a test: pytest lets it through with no teardown
    and no report; the session's end tears the test's fixtures down, which reports
    nothing, so its mailboxes' receipts reached no receipts file. A test that has a
    mailbox open is torn down here instead, as its own teardown would be (the call never
    ended: ``released_error``), before the interrupt goes on: its receipt goes to the
    receipts file, and a teardown that fails is reported as any is. JUnit XML gets no test
    case for it, as pytest writes none for a test stopped so. Not in an xdist worker,
    where the controller writes the receipts file and xdist itself stops with an
    internal error.

    Not torn down again once the test's teardown began (Ctrl-C or ``pytest.exit()`` in a
    fixture's teardown): pytest has taken the test's finalizers off its stack, so a second
    teardown would not close the mailbox, and pytest's own teardown hooks, run twice, fail
    (its logging plugin's with a ``KeyError``). See ``_stopped_in_teardown``."""
    try:
        return (yield)
    except (pytest.exit.Exception, KeyboardInterrupt):
        if not _is_worker(item.config):
            if item.stash.get(_teardown_began_key, False):
                _stopped_in_teardown(item)
            elif item.stash.get(_mailboxes_key, None):
                _teardown_stopped(item)
        raise


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    """The test's teardown begins: an interrupt from here on is no call cut short (see
    ``pytest_runtest_protocol``)."""
    item.stash[_teardown_began_key] = True


def _teardown_stopped(item: pytest.Item) -> None:
    """Tear down ``item``, and the session with it, that an interrupt stopped mid-test."""
    from _pytest.runner import call_and_report  # noqa: PLC0415 - pytest's own teardown step

    if item.stash.get(_setup_reported_key, False):
        report = call_and_report(item, "teardown", log=False, nextitem=None)
    else:
        # Stopped in its setup, which pytest then reports to no plugin: those that keep
        # their own state per test from the setup's report (pytest-rerunfailures, loaded
        # even without --reruns) fail on a teardown's report after none, and the run
        # ended in an INTERNALERROR, without the receipt. The report is this plugin's own.
        reraise: tuple[type[BaseException], ...] = (pytest.exit.Exception,)
        if not item.config.getoption("usepdb", False):
            reraise += (KeyboardInterrupt,)
        call = pytest.CallInfo.from_call(
            lambda: item.ihook.pytest_runtest_teardown(item=item, nextitem=None),
            when="teardown",
            reraise=reraise,
        )
        report = _made_report(item, call, pytest.TestReport.from_item_and_call(item, call))
    if report.failed:  # an error like any teardown's: every plugin sees it
        item.ihook.pytest_runtest_logreport(report=report)
        return
    _report_alone(item, report)


def _stopped_in_teardown(item: pytest.Item) -> None:
    """Ctrl-C or ``pytest.exit()`` in the test's teardown, which pytest then reports to no
    one: the receipts its mailboxes' teardown made went nowhere. A teardown stopped so is
    no pass, as a crash in one is under xdist: a mailbox its teardown released as a success
    (``pytest.exit()`` lets the other finalizers run) becomes ``released_error``, one whose
    teardown never ran (Ctrl-C stops them) is closed here, and their receipts go to the
    receipts file."""
    _close_left_open(item)
    closed = item.stash.get(_closed_key, [])
    if not closed:  # none, or its teardown's report carried them before the interrupt
        return
    call: pytest.CallInfo[None] = pytest.CallInfo.from_call(lambda: None, when="teardown")
    report = pytest.TestReport.from_item_and_call(item, call)
    _teardown_failed(item, report, closed)
    _report_alone(item, _made_report(item, call, report))


def _report_alone(item: pytest.Item, report: pytest.TestReport) -> None:
    """Give a report pytest never made to the plugin's own bookkeeping alone."""
    manager = item.config.pluginmanager
    for name in ("mailbox-receipts", "mailbox-reported"):
        plugin = manager.get_plugin(name)
        if plugin is not None:
            plugin.pytest_runtest_logreport(report)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Mark the test's call as running, so its subtests' reports are told from its own;
    and whether it returned, which the call's report then judges (an xfail, say). A plugin
    that calls the test again reports the new call to no one (pytest-retry), or makes the
    earlier call's report say how the last one went, before or after the plugin sees it."""
    item.stash[_in_call_key] = True
    item.stash[_passed_key] = False
    try:
        result = yield
    finally:
        item.stash[_in_call_key] = False
    item.stash[_passed_key] = True
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: after xfail has had its say
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failure shows the test's mailboxes' timelines; a report that is not a pass has
    what the test extracted masked here, in the process that ran it, before xdist, JUnit
    or the terminal take it."""
    report = yield
    if report.when == "setup":
        item.stash[_setup_reported_key] = True
    return _made_report(item, call, report)


def _made_report(
    item: pytest.Item, call: pytest.CallInfo[None], report: pytest.TestReport
) -> pytest.TestReport:
    """What the plugin makes of a phase's report (see ``pytest_runtest_makereport``)."""
    # A subtest's report is a "call" report too, made while the test's call still runs:
    # the test passed only if its own call report, made after the call, says so.
    if report.when == "call" and not item.stash.get(_in_call_key, False):
        item.stash[_passed_key] = report.passed
    if report.failed and report.when in ("setup", "call"):
        item.stash[_failed_key] = True
        for mailbox in item.stash.get(_mailboxes_key, []):
            try:
                mailbox.did_not_pass()  # released early as a success: its timeline says so
                timeline = mailbox.receipt().timeline()
            except StoreError as exc:  # the store failed under the test: no INTERNALERROR
                timeline = f"{mailbox.address}: its timeline could not be read: {exc}"
            report.sections.append(("mailbox", timeline))
        if call.excinfo is not None and "mailbox_server" in getattr(item, "fixturenames", ()):
            hint = _socket_hint(call.excinfo.value, item.config.stash[_settings_key].host)
            if hint is not None:
                report.sections.append(("mailbox", hint))
    if report.when == "teardown":
        if report.failed:
            _left_open(item, report)
        # pytest keeps every item to the end of the session: the receipts are all that stay.
        closed, item.stash[_closed_key] = item.stash.get(_closed_key, []), []
        if report.failed:  # a later fixture's teardown failed the test after its mailbox
            _teardown_failed(item, report, closed)
        item.stash[_carried_key] = [
            *item.stash.get(_carried_key, []),
            *item.stash.get(_attached_key, []),
        ]
        item.stash[_attached_key] = []
    if not report.passed or report.sections:  # a pass shows its output too: -rP, JUnit, …
        _mask_extracted(report)
    _mask_recorded(item, report)
    _mask_json_report(report)
    return report


def _left_open(item: pytest.Item, report: pytest.TestReport) -> None:
    """Close the mailboxes a failed teardown left open, as no success, and put their receipts
    in its report. What pytest reports as a teardown's error and goes on from, though it
    stops the test's other finalizers (``sys.exit()`` in a fixture's teardown, Ctrl-C under
    ``--pdb``), skipped their teardown: the session's end closed them as
    ``released_success``, acking what the test held, and their receipts reached no file."""
    report.user_properties.extend(_close_left_open(item))


def _socket_hint(exc: BaseException | None, host: str) -> str | None:
    """What to allow, if pytest-socket refused this test a socket, or a connection to the
    sink's host: its error, or under ``-W error`` the warning it gives first (``A test
    tried to use socket.socket.``), or an app's error raised from either. None for a
    connection it refused to another host, which is none of the sink's business: another
    loopback address too (``127.0.0.2``, a service's), unless it is the other address
    ``localhost`` names (``::1`` beside ``127.0.0.1``), which the hint then names too."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        if type(exc).__module__ == "pytest_socket" or (
            isinstance(exc, UserWarning) and text.startswith("A test tried to use socket")
        ):
            refused = _REFUSED_HOST.search(text)
            hosts = [host] if refused is None else _sink_hosts(refused[1], host)
            if not hosts:
                return None
            listed = ",".join(hosts)
            return (
                "pytest-socket blocked a connection of this test, and the mailbox sink listens "
                f"on {host}: let the test reach it with --allow-hosts={listed} (beside "
                f"--disable-socket; add {listed} to a list you give) or "
                f"@pytest.mark.allow_hosts({hosts!r}) on the test"
            )
        exc = exc.__cause__ or exc.__context__
    return None


#: The two loopback addresses ``localhost`` names, in either order of a pair.
_LOOPBACKS = {ip_of("127.0.0.1"), ip_of("::1")}


def _sink_hosts(refused: str, host: str) -> list[str]:
    """The hosts to allow for a connection pytest-socket refused to ``refused``: the sink's
    own; the sink's and ``refused`` if the two are the addresses ``localhost`` names (an
    app given ``localhost`` tries ``::1`` first); none for any other host."""
    ours, theirs = ip_of(host), ip_of(refused)
    if refused == host or (ours is not None and ours == theirs):
        return [host]
    if ours is None and is_loopback(host) and is_loopback(refused):
        return [host]  # a name (localhost): pytest-socket allows all it resolves to
    if {ours, theirs} == _LOOPBACKS:
        return [host, refused]
    return []


#: The host in pytest-socket's refusal of a connection (``--allow-hosts``).
_REFUSED_HOST = re.compile(r'connect\(\) with host "([^"]*)"')


def _teardown_failed(
    item: pytest.Item, report: pytest.TestReport, closed: list[tuple[Mailbox, tuple[str, str]]]
) -> None:
    """A teardown that failed after the mailboxes closed: the test did not pass, so their
    receipts (already in the report) become ``released_error``, and its report shows their
    timelines, as a failed call's does."""
    from pytest_mailbox.contract import dump_receipt  # noqa: PLC0415 - see TYPE_CHECKING

    for mailbox, attached in closed:
        try:
            with _kept_closed(mailbox.store):
                mailbox.did_not_pass()
                receipt = mailbox.receipt().model_copy(
                    update={"testrun_uid": item.config.stash[_testrun_key]}
                )
        except StoreError:  # the store failed since: the receipt it left stands
            continue
        now = (RECEIPT_PROPERTY, dump_receipt(receipt))
        for properties in (report.user_properties, item.user_properties):
            properties[:] = [now if p is attached else p for p in properties]
        attached_now = item.stash.get(_attached_key, [])
        attached_now[:] = [now if p is attached else p for p in attached_now]
        report.sections.append(("mailbox", receipt.timeline()))


class _ShownOutput:
    """What pytest shows beyond a test's own report: a subtest's captured output, which it
    gets after ``pytest_runtest_makereport`` (its traceback was masked there), a report
    another plugin made or changed after that hook (pytest-retry's), the warnings summary,
    and pytest-retry's summary of the attempts it retried; masked before xdist sends them
    or the terminal shows them."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """pytest-retry reports a failed attempt ("retried") once it has torn the test down,
        and gives the first attempt's report the last attempt's traceback, which it made
        without ``pytest_runtest_makereport``: masked again here, where xdist, JUnit and
        pytest-html take them (masking what is masked changes nothing)."""
        if type(report) is not pytest.TestReport:
            _mask_context(report)
        if not report.passed or report.sections:
            _mask_extracted(report)

    @pytest.hookimpl(trylast=True)
    def pytest_sessionstart(self) -> None:
        """pytest-retry writes each retried attempt's exception (``AssertionError: wrong
        code 482913``) into a summary of its own, sent from an xdist worker to the
        controller as it goes: masked as it is written, in the process that ran the test."""
        retry = sys.modules.get("pytest_retry.retry_plugin")
        reporter: Any = getattr(getattr(retry, "retry_manager", None), "reporter", None)
        record = getattr(reporter, "record_attempt", None)
        if not callable(record) or reporter in _MASKED_RETRY_REPORTERS:
            return

        def record_masked(lines: list[str]) -> None:
            mask = _masker()
            record(lines if mask is None else [mask(line) for line in lines])

        try:
            reporter.record_attempt = record_masked
            _MASKED_RETRY_REPORTERS.add(reporter)
        except (AttributeError, TypeError):  # pragma: no cover - another pytest-retry
            return

    @pytest.hookimpl(tryfirst=True)
    def pytest_warning_recorded(self, warning_message: warnings.WarningMessage) -> None:
        """The warnings summary quotes a warning's message: ``warn(f"... {code}")``."""
        mask = _masker()
        text = str(warning_message.message)
        if mask is not None and (masked := mask(text)) != text:
            warning_message.message = masked  # a str, as xdist sends one


#: pytest-retry's reporters whose summary lines are masked (one per process, kept across
#: in-process runs).
_MASKED_RETRY_REPORTERS: weakref.WeakSet[Any] = weakref.WeakSet()


def _mask_context(report: pytest.TestReport) -> None:
    """A subtest's description (``subtests.test(msg=..., **kwargs)``), which the terminal
    shows on its line (``SUBFAILED[code ••••98]``) and above its failure, passed or not."""
    context = getattr(report, "context", None)
    mask = _masker() if context is not None else None
    if mask is None:
        return
    msg = getattr(context, "msg", None)
    if isinstance(msg, str):
        object.__setattr__(context, "msg", mask(msg))  # pytest's is a frozen dataclass
    kwargs = getattr(context, "kwargs", None)
    if isinstance(kwargs, dict) and kwargs:
        # pytest 9 keeps each value's repr; the pytest-subtests plugin the value itself,
        # which it shows with !r: a value whose repr shows a secret becomes the masked text
        shown = {
            k: mask(v) if isinstance(v, str) else _masked_value(v, mask, repr)
            for k, v in kwargs.items()
        }
        object.__setattr__(context, "kwargs", shown)


def _mask_recorded(item: pytest.Item, report: pytest.TestReport) -> None:
    """What the test recorded for JUnit XML itself, ``record_property`` (the report's
    ``user_properties``, which xdist sends) and, at teardown, ``record_testsuite_property``
    (JUnit's own list, written at the end of the run): ``record_property("url", link)``.
    The plugin's receipts are left as they are: secret-free, and their digests' hex could
    hold an extracted number's digits."""
    own = any(_own_property(entry) for entry in report.user_properties)
    junit = item.config.stash.get(junitxml.xml_key, None) if report.when == "teardown" else None
    suite = junit is not None and bool(junit.global_properties)
    if not own and not suite:  # most reports: the receipt alone, nothing to build a mask for
        return
    mask = _masker()
    if mask is None:
        return
    if own:
        report.user_properties = [
            (entry[0], _masked_value(entry[1], mask)) if _own_property(entry) else entry
            for entry in report.user_properties
        ]
    if suite and junit is not None:
        junit.global_properties[:] = [
            (name, mask(value)) for name, value in junit.global_properties
        ]


def _mask_json_report(report: pytest.TestReport) -> None:
    """pytest-json-report keeps its own copy of what a test printed and logged (each log
    record whole: its message, ``exc_text``, ``extra`` fields) and of its
    ``json_metadata``, in ``report._json_report_extra``: it writes that to its JSON file,
    and xdist and pytest-reportlog send or write it with the report. Masked as the
    report's own sections are, a passing test's too."""
    extra = getattr(report, "_json_report_extra", None)
    mask = _masker() if isinstance(extra, dict) and extra else None
    if mask is not None:
        _masked_json(extra, mask, set())


def _masked_json(node: Any, mask: Callable[[str], str], seen: set[int]) -> Any:
    """``node``, JSON data, with ``mask`` applied to its text and to its numbers' (a code
    kept as ``int(code)`` in ``json_metadata`` or a log record's ``extra``, written as
    the number, as ``record_property``'s value is masked by its text): dicts and lists
    changed in place, the rest replaced."""
    if isinstance(node, dict | list) and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, dict):
            for key, value in node.items():
                node[key] = _masked_json(value, mask, seen)
        else:
            node[:] = [_masked_json(value, mask, seen) for value in node]
        return node
    if isinstance(node, tuple):
        return tuple(_masked_json(part, mask, seen) for part in node)
    if isinstance(node, int | float) and not isinstance(node, bool):
        return _masked_value(node, mask)
    return _masked(node, mask, seen)  # text: as the report's


def _own_property(entry: object) -> bool:
    """A ``(name, value)`` the test recorded (a list of two too, as JUnit takes one), not
    the plugin's receipt (nor an entry that is no pair: pytest's JUnit fails on it)."""
    return isinstance(entry, tuple | list) and len(entry) == 2 and entry[0] != RECEIPT_PROPERTY


def _masked_value(
    value: object, mask: Callable[[str], str], text_of: Callable[[object], str] = str
) -> object:
    """``value``, or its text (``str()``, as JUnit writes it) masked where that hides
    something; a value with no text stays as it is."""
    try:
        text = text_of(value)
    except Exception:  # a __str__ that raises: whatever shows it fails on it, not this
        return value
    masked = mask(text)
    return value if masked == text else masked


def _masker() -> Callable[[str], str] | None:
    """What masks a report or a warning (``message.Masker``): the values the running test
    extracted, from any mailbox and whatever their length, and those of mailboxes still
    open (a session fixture's), and what this process remembers of other tests, wherever
    they show (a number where no digit touches it); the short ones of open mailboxes only
    where they stand alone.
    None if there is nothing to mask (nothing before the message module was imported:
    nothing was extracted). Built once for each set of values."""
    message = sys.modules.get("pytest_mailbox.message")
    if message is None:
        return None
    mailbox = sys.modules.get("pytest_mailbox.mailbox")
    live = mailbox.live_extracted() if mailbox is not None else set()
    values = {*message.TEST_EXTRACTED, *(v for v in live if len(v) >= message._MIN_EXTRACTED)}
    words = {v for v in live if len(v) < message._MIN_EXTRACTED} - values
    shared = set(message._EXTRACTED)
    if not values and not words and not shared:
        return None
    key = (frozenset(values), frozenset(words), frozenset(shared))
    if _MASKERS.get(key) is None:
        _MASKERS.clear()  # the values change with each test that extracts: keep the last
        escaped = {repr(value)[1:-1] for value in values}  # as a repr shows them
        _MASKERS[key] = message.Masker({*values, *escaped}, words, shared)
    return _MASKERS[key]


_MASKERS: dict[tuple[frozenset[str], ...], Callable[[str], str]] = {}


def _mask_extracted(report: pytest.TestReport) -> None:
    mask = _masker()
    if mask is not None:
        _mask_report(report, mask)


def _mask_report(report: pytest.TestReport, mask: Callable[[str], str]) -> None:
    """Apply ``mask`` wherever a report shows text: its long representation (source and
    explanation lines, arguments, locals, the crash message that the short summary and
    JUnit take), its captured output and its xfail reason.

    pytest's repr objects are changed in place, so that their structure (colours, ``--tb``
    styles, xdist's serialisation, JUnit, pytest-html) stays as it was.
    """
    longrepr = report.longrepr
    if isinstance(longrepr, str | tuple | TerminalRepr):  # a skip's: (path, line, reason)
        report.longrepr = _masked(longrepr, mask, set())
    elif longrepr is not None:  # pragma: no cover - pytest makes one of the above
        report.longrepr = mask(str(longrepr))  # what xdist would send of it
    _masked(report.sections, mask, set())
    wasxfail = getattr(report, "wasxfail", None)
    if isinstance(wasxfail, str):
        report.wasxfail = mask(wasxfail)


def _masked(node: Any, mask: Callable[[str], str], seen: set[int]) -> Any:
    """``node`` with ``mask`` applied to all its text: lists and repr objects changed in
    place (the ``seen`` ones once: a chain's last traceback is also the report's), strings
    and tuples replaced."""
    if isinstance(node, str):
        text = mask(node)
        if text == node or "\n" not in text:
            return text
        return "\n".join(_unguided(text.split("\n")))  # the crash message, say
    if isinstance(node, tuple):
        return tuple(_masked(part, mask, seen) for part in node)
    if isinstance(node, list | TerminalRepr) and id(node) not in seen:
        seen.add(id(node))
        if isinstance(node, list) and _lines(node):
            # Masked together: a diff's header says where the lines after it were cut.
            masked = mask("\n".join(node)).split("\n")
            if len(masked) != len(node):
                masked = [mask(line) for line in node]
            node[:] = masked if masked == node else _unguided(masked)
        elif isinstance(node, list):
            node[:] = [_masked(part, mask, seen) for part in node]
        else:
            for name, value in list(vars(node).items()):
                if name != "style":  # "long", "short", …: read by pytest, never shown
                    setattr(node, name, _masked(value, mask, seen))
    return node


def _unguided(lines: list[str]) -> list[str]:
    """``lines`` that the mask changed, without a diff's guide lines (``?   ^^^^``): under
    either line of a pair they point at the characters in which the masked value differs
    from the other, which is shown (``- 482914``, ``?      ^``, ``+ ••••13``: 482913).
    A guide line follows the ``- `` or ``+ `` line it marks, with its indentation."""
    kept: list[str] = []
    for line in lines:
        guide = _DIFF_GUIDE.fullmatch(line)
        if guide and kept and kept[-1].startswith((guide[1] + "- ", guide[1] + "+ ")):
            continue
        kept.append(line)
    return kept


#: difflib's guide line, as pytest shows it: its indentation (group 1), then ``? ``.
_DIFF_GUIDE = re.compile(r"(E?\s*)\? [\t ^+-]*")


def _lines(node: list[Any]) -> bool:
    """``node`` is a report's lines: strings of one line each."""
    return bool(node) and all(isinstance(line, str) and "\n" not in line for line in node)


def _lists_only(config: pytest.Config) -> bool:
    """A run that shows tests or fixtures and runs nothing: ``--setup-plan`` sets up no
    fixture, so it reserves no mailbox."""
    option = config.option
    return bool(
        option.collectonly
        or option.showfixtures
        or option.show_fixtures_per_test
        or getattr(option, "setupplan", False)
    )


def _holds_receipts(path: Path) -> bool:
    """Whether the run may empty ``path``: it is new, blank, or its first line is a receipt
    (a JSON object with a run_id and a mailbox_id, as an earlier run wrote it) or the start
    of one (a run cut short mid-line). Read with
    ``json``: a run without mail tests imports no pydantic."""
    import json  # noqa: PLC0415 - only where a receipts file is given

    if not path.is_file():  # new; or no file to read (a pipe would block): refused later
        return True
    try:
        with path.open("rb") as stream:
            for line in iter(lambda: stream.readline(1 << 24), b""):
                first = line.removeprefix(codecs.BOM_UTF8).strip()
                if first:
                    break
            else:
                return True  # empty, or blank lines only
    except OSError:  # unreadable: the writer's own error says why
        return True
    if _RECEIPT_START.match(first):
        # A receipt, or the start of one: a run cut short as it wrote its first receipt
        # (a full disk, a kill) left it so, and a receipt longer than a read is cut too.
        return True
    try:
        found = json.loads(first)
    except ValueError:
        return False
    return isinstance(found, dict) and "run_id" in found and "mailbox_id" in found


#: How a receipt's line begins, as the writer writes it (``Receipt``'s first fields).
_RECEIPT_START = re.compile(rb'\{"version":\d+,"run_id":"')


class _ReceiptWriter:
    """Writes receipts to the JSON Lines file, on the controller only: workers' reports reach it."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        # Opened (so a path that cannot be written fails at start-up) but not emptied: that
        # waits for the collection of a run (so --fixtures and --markers keep the file).
        self.stream = path.open("a", encoding="utf-8")
        # The file as first opened, once its basetemp was emptied: held to the run's end.
        self._emptied: TextIO | None = None

    @pytest.hookimpl(tryfirst=True)  # before xdist starts its workers
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        # The file is a run's until it ends: a second run at the same time would empty it
        # and mix its receipts in. Runs that only list (an IDE's --collect-only) share it.
        if _lists_only(session.config):
            return
        self._take()
        if self._reopened_in_basetemp(session.config):
            self._take()

    def _take(self) -> None:
        if not _lock(self.stream):
            msg = (
                f"pytest-mailbox: --mailbox-receipts={str(self.path)!r} is being written by "
                "another pytest run; give each run its own file (--mailbox-receipts, ini "
                "mailbox_receipts or PYTEST_MAILBOX_RECEIPTS)"
            )
            raise pytest.UsageError(msg)

    def _reopened_in_basetemp(self, config: pytest.Config) -> bool:
        """A file inside a given ``--basetemp`` (one folder for all a CI keeps) goes when
        pytest empties it, which it does when it first makes it (for the first tmp_path,
        the store, xdist's workers): the receipts were written on to no name, and the lock
        kept no second run out. Once this run holds the file, the basetemp is made now
        and the file opened in it again, to be taken again (True). The file first taken
        stays open, and locked, to the run's end: a second run that opened it before the
        basetemp was emptied (two runs started at once) would take it otherwise, and
        empty this run's basetemp, store included."""
        given = config.getoption("basetemp", None)
        factory = _tmp_path_factory(config)
        if not given or factory is None:
            return False
        where = self.path.resolve()
        if not where.is_relative_to(Path(os.path.abspath(given)).resolve()):
            return False
        factory.getbasetemp()
        self._emptied = self.stream
        where.parent.mkdir(parents=True, exist_ok=True)
        self.stream = where.open("a", encoding="utf-8")
        return True

    @pytest.hookimpl(wrapper=True)
    def pytest_collection(self, session: pytest.Session) -> Generator[None, object, object]:
        # A run that collects to run tests holds this run's receipts only, from the start:
        # one that fails in collection leaves no receipts of the run before it.
        # (--fixtures collects without this hook.)
        if not _lists_only(session.config):
            self.stream.truncate(0)
        return (yield)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when not in ("teardown", "???"):  # "???": xdist's report of a crash
            return
        for value, _ in _full_receipts_of(report):
            self.stream.write(f"{value}\n")
            self.stream.flush()

    def pytest_unconfigure(self) -> None:
        self.stream.close()
        if self._emptied is not None:
            self._emptied.close()


def _lock(stream: TextIO) -> bool:
    """Take the file for this run (an advisory lock, freed when the stream closes or the
    process dies), or say that another run has it."""
    if sys.platform == "win32":  # pragma: no cover - no flock; the file is shared as before
        return True
    import fcntl  # noqa: PLC0415 - not on Windows

    try:
        fcntl.flock(stream.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError:  # pragma: no cover - a file system without locks (some NFS mounts)
        return True
    _LOCKED.add(stream)
    return True


#: The receipts files this process holds locked. ``flock`` belongs to the open file, and a
#: child that a test forks (``multiprocessing``, an app server) shares it: one that outlives
#: the run would hold the file against the next run.
_LOCKED: weakref.WeakSet[TextIO] = weakref.WeakSet()


def _unlock_in_child() -> None:
    """In a forked child: point the descriptor at ``/dev/null`` instead (closing it would
    leave the stream's own close to fail; unlocking would free the parent's lock too)."""
    for stream in list(_LOCKED):
        if not stream.closed:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
    _LOCKED.clear()


if sys.platform != "win32":
    os.register_at_fork(after_in_child=_unlock_in_child)


class _CrashReceipts:
    """xdist's controller: a worker died inside a test, whose teardown report never came.

    The test's open mailboxes are closed at once (``orphaned``, then ``released`` as
    ``released_error``: what the end of the run would do to them, only sooner; one whose
    ttl ran out ends ``expired``, as it is). The receipt of every mailbox the test
    reserved in that worker and that no report brought here goes into the crash report,
    as a passing teardown would have put it: a property (JUnit XML too), the JSON Lines
    file, and a ``mailbox`` section with the timeline. That includes a mailbox its own
    teardown released before a later fixture's teardown killed the worker. A store that
    cannot be used then (another program replaced it) is said in that section instead.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(
        self, crashitem: str, report: pytest.TestReport, sched: object
    ) -> None:
        config = self.config
        path = _run_store_path(config)
        if path is None or not path.exists():
            return
        node = getattr(report, "node", None)
        worker = str(getattr(getattr(node, "gateway", None), "id", ""))
        workerinput: dict[str, str] = getattr(node, "workerinput", {})
        testrun_uid = workerinput.get("testrunuid") or config.stash[_testrun_key]
        from pytest_mailbox.contract import dump_receipt  # noqa: PLC0415 - see TYPE_CHECKING
        from pytest_mailbox.mailbox import Mailbox  # noqa: PLC0415
        from pytest_mailbox.store import Store  # noqa: PLC0415

        reported = config.stash[_reported_key].mailboxes  # the receipts reports brought
        store: Store | None = None
        try:
            store = Store(path)
            store.close_orphans(
                owner=crashitem,
                worker=worker,
                testrun=config.stash[_run_key],
                detail=f"worker {worker} crashed while running the test",
            )
            rows = [
                store.mailbox(mailbox_id)
                for mailbox_id in store.mailbox_ids(
                    owner=crashitem, worker=worker, testrun=config.stash[_run_key]
                )
                if mailbox_id not in reported
            ]
            contract = config.stash[_settings_key].contract
            mailboxes = [
                Mailbox(store, row, contract=contract, nodeid=crashitem)
                for row in rows
                if row is not None
            ]
            for mailbox in mailboxes:  # a crash is no pass, even in a later teardown
                mailbox.did_not_pass()
            receipts = [
                mailbox.receipt().model_copy(update={"testrun_uid": testrun_uid})
                for mailbox in mailboxes
            ]
        except StoreError as exc:  # said in the crash's report: no INTERNALERROR
            report.sections.append(
                ("mailbox", f"pytest-mailbox could not close this test's mailboxes: {exc}")
            )
            return
        finally:
            if store is not None:
                store.close()
        junit = config.stash.get(junitxml.xml_key, None)  # properties only at teardown
        for receipt in receipts:
            value = dump_receipt(receipt)
            report.user_properties.append((RECEIPT_PROPERTY, value))
            report.sections.append(("mailbox", receipt.timeline()))
            if junit is not None:
                reporter = junit.node_reporter(report)
                # Named now: a report pytest-rerunfailures marked "rerun" is one JUnit never
                # records, and its <testcase> would be written with no name at all.
                reporter.record_testreport(report)
                reporter.add_property(RECEIPT_PROPERTY, value)


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    """One line on the controller: what the run's mailboxes saw (not under ``-qq``, where
    pytest leaves out its own counts), and the warnings about them (always)."""
    counts = config.stash.get(_stats_key, None)
    if counts is not None and terminalreporter.verbosity > -2:
        terminalreporter.write_line("mailbox: " + ", ".join(f"{n} {k}" for k, n in counts.items()))
    reported = config.stash.get(_reported_key, None)
    if reported is not None and reported.expired:
        terminalreporter.write_line(reported.expired_summary(), yellow=True)
    if reported is not None and reported.lapsed:
        terminalreporter.write_line(reported.lapsed_summary(), yellow=True)
    said = config.stash.get(_foreign_key, None)
    if said is not None:
        terminalreporter.write_line(said, yellow=True)
    said = config.stash.get(_store_failed_key, None)
    if said is not None:  # the run fails with it (exit status 3): see pytest_sessionfinish
        terminalreporter.write_line(said, red=True, bold=True)


#: A receipt's own mailbox id, as ``dump_receipt`` writes it: the first ``mailbox_id`` key
#: of its compact JSON (before its messages and the agent's evidence; no string value holds
#: an unescaped quote, so what matches is a key).
_MAILBOX_ID = re.compile(r'"mailbox_id":"(mbx-[0-9a-f]{12})"')


def _receipts_of(report: pytest.TestReport) -> Iterator[tuple[str, str]]:
    """(value, mailbox id) of each receipt among a report's properties. A test's own
    property that borrowed the name and holds something else is passed over: a user's
    value must not stop the run, nor reach the receipts file. (A search for the id, not
    ``json.loads``: the controller reads every test's receipt, for the crash bookkeeping,
    and needs only the id; the receipts file and pytest-html take only whole receipts,
    ``_full_receipts_of``.)"""
    for name, value in report.user_properties:
        if name == RECEIPT_PROPERTY and isinstance(value, str):
            found = _MAILBOX_ID.search(value)
            if found is not None:
                yield value, found.group(1)


def _full_receipts_of(report: pytest.TestReport) -> Iterator[tuple[str, Receipt]]:
    """(value, receipt) of each property that holds a whole receipt."""
    for value, _ in _receipts_of(report):
        if (receipt := parse_receipt(value)) is not None:
            yield value, receipt


#: A receipt whose mailbox outlived its ttl: its top-level key, as ``_MAILBOX_ID`` reads one.
_EXPIRED = re.compile(r'"close_reason":"expired_timeout"')


#: A receipt with a step that ended a claim because its lease ran out.
_LEASE_EXPIRED = '"status":"lease_expired"'


def _lapsed(value: str) -> bool:
    """Whether a receipt has a message its run claimed that ended unconsumed, its last
    step a lapsed lease: nothing acked it, and no later claim took it (a test paused in a
    debugger past its lease, whose teardown then had nothing live to ack)."""
    if _LEASE_EXPIRED not in value:  # most receipts: no parsing
        return False
    receipt = parse_receipt(value)
    if receipt is None:
        return False
    for message in receipt.messages:
        if message.state == "consumed" or message.claimed_at is None:
            continue
        steps = [e.status for e in receipt.events if e.detail.startswith(message.message_id + " ")]
        if steps and steps[-1] == "lease_expired":
            return True
    return False


class _Reported:
    """What the reports said of the run's mailboxes: which mailboxes they name (so that a
    store another run replaced is not counted as this run's), and the tests that passed
    with a mailbox that outlived its ttl (their teardown could not ack what they claimed,
    and nothing but the receipt said so)."""

    SHOWN = 5  # test ids named in the summary; the rest are counted

    def __init__(self) -> None:
        self.mailboxes: set[str] = set()  # the ids of the receipts the reports carried
        self.passed: set[str] = set()  # this run's tests whose call passed
        self.expired: list[str] = []
        self.lapsed: list[str] = []  # passed, with a claim whose lease ended unacked

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if type(report) is not pytest.TestReport:  # a subtest's: the test's own call decides
            return
        if report.when == "call":  # a failed call after a passed attempt (a rerun) too
            if report.passed:
                self.passed.add(report.nodeid)
            else:
                self.passed.discard(report.nodeid)
            return
        if report.when not in ("teardown", "???"):  # "???": xdist's report of a crash
            return
        receipts = list(_receipts_of(report))
        self.mailboxes.update(mailbox_id for _, mailbox_id in receipts)
        passed = report.nodeid in self.passed
        self.passed.discard(report.nodeid)
        # A failed teardown (or its rerun) is no pass, and its report shows the timeline.
        if not (passed and report.passed):
            return
        if report.nodeid in self.expired:
            return
        if any(_EXPIRED.search(value) for value, _ in receipts):
            self.expired.append(report.nodeid)
        elif report.nodeid not in self.lapsed and any(_lapsed(value) for value, _ in receipts):
            self.lapsed.append(report.nodeid)

    def _named(self, tests: list[str]) -> str:
        more = len(tests) - self.SHOWN
        return ", ".join(tests[: self.SHOWN]) + (f" and {more} more" if more > 0 else "")

    def expired_summary(self) -> str:
        return (
            f"mailbox: {len(self.expired)} passing test(s) outlived their mailbox's ttl, so "
            "nothing they claimed could be acked at teardown (receipt: expired_timeout): "
            + self._named(self.expired)
            + "; give them a longer ttl (email_contract(ttl=...) or mailbox_ttl)"
        )

    def lapsed_summary(self) -> str:
        return (
            f"mailbox: {len(self.lapsed)} passing test(s) held a claim whose lease ended "
            "before it was acked, so teardown could not ack it and the message is left "
            "unconsumed (receipt: lease_expired): "
            + self._named(self.lapsed)
            + "; ack() or renew() it while the lease lasts, or give them a longer lease "
            "(email_contract(lease=...) or mailbox_lease)"
        )


class _ShownSections:
    """The terminal's report sections, a line a line whatever characters it can show.

    pytest writes a section in one piece and, if its stream cannot encode a character of
    it (an ASCII stdout: ``LC_ALL=C`` with ``PYTHONUTF8=0``, ``PYTHONIOENCODING=ascii``; a
    code page such as cp1252), writes the whole piece escaped: a timeline with a selector's
    ``ó``, or a test's ASCII output once the mask's ``•`` was in it, became one line, its
    line breaks ``\\n``. Here each character the stream lacks is escaped alone instead,
    before pytest's summaries show the sections and after ``pytest_sessionfinish``, where
    the files (JUnit XML, pytest-html, the JSON reports) took them as they are."""

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter
    ) -> Generator[None, None, None]:
        # The stream pytest writes to is its TerminalWriter's (sys.stdout when it began).
        stream = getattr(getattr(terminalreporter, "_tw", None), "_file", None)
        if _writes_all(stream):  # UTF-8, as most are: nothing to look at
            return (yield)
        for reports in terminalreporter.stats.values():
            for report in reports:
                sections = getattr(report, "sections", None)
                if isinstance(sections, list) and sections:
                    report.sections = [
                        (name, printable(text, stream) if isinstance(text, str) else text)
                        for name, text in sections
                    ]
        return (yield)


def _writes_all(stream: object) -> bool:
    """``stream`` encodes every character (UTF-8, -16, -32), or is no text stream."""
    encoding = getattr(stream, "encoding", None)
    if not isinstance(encoding, str):
        return True
    try:
        return codecs.lookup(encoding).name.startswith("utf")
    except LookupError:
        return True


class _HtmlReceipts:
    """pytest-html: each test's row shows its receipt's timeline (registered only with it)."""

    def __init__(self) -> None:
        self.receipts: dict[str, list[Receipt]] = {}

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> Generator[None, None, None]:
        """pytest-html renders a test's rows in its own logreport of the teardown (trylast),
        and never again: the receipts are kept for it, and no longer (a run of 2,000 tests
        kept 2,000 receipts, each a dozen models, to its end)."""
        if report.when != "teardown":
            return (yield)
        self.receipts[report.nodeid] = [receipt for _, receipt in _full_receipts_of(report)]
        try:
            return (yield)
        finally:
            self.receipts.pop(report.nodeid, None)

    def pytest_html_results_table_html(self, report: pytest.TestReport, data: list[str]) -> None:
        for receipt in self.receipts.get(report.nodeid, []):
            data.append(
                f'<div class="mailbox-receipt" data-run-id="{html.escape(receipt.run_id)}">'
                f"<pre>{html.escape(receipt.timeline())}</pre></div>"
            )
