"""One Python process, many pytest sessions: what an IDE, a notebook (ipytest) or a test
harness does when it calls ``pytest.main`` again and again, and how the plugin is loaded
there (by its entry point, by name, or both)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

#: What these tests' inner runs leave out: plugins that would change them (see conftest.py).
BLOCKED = ["-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry"]

SUITE = """
import smtplib


def test_mail(isolated_mailbox, mailbox_server):
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        smtp.sendmail(
            "noreply@app.example.test",
            [isolated_mailbox.address],
            "Subject: Verify\\r\\n\\r\\nhttps://app.example.test/v?token=t0k3n-A7k9Q2x8Zr5w\\r\\n",
        )
    isolated_mailbox.wait_for(subject="Verify", timeout=10).ack()
"""


def _drive(path: Path, script: str, *, env: dict[str, str] | None = None) -> str:
    """Run ``script`` in a Python process of its own in ``path``, warnings as errors; its
    output. The timeout is a hang net only."""
    driver = path / "driver.py"
    driver.write_text(script)
    done = subprocess.run(
        [sys.executable, "-W", "error", str(driver)],
        cwd=path,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


@pytest.mark.parametrize("loaded_by", ["entry point", "conftest"])
def test_pytest_main_in_a_process_that_imported_the_plugin_before_warns_of_nothing(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, loaded_by: str
) -> None:
    """A harness or a notebook that imports ``pytest_mailbox`` (for ``Mailbox`` in a type
    hint, say) before it calls ``pytest.main``: pytest marks an installed plugin's package
    for assertion rewriting, and warned that it was imported already and cannot be
    (``PytestAssertRewriteWarning``), which ``-W error`` or ``filterwarnings = error``
    made the run's end at its start. The plugin's modules hold no test asserts: it asks
    for none (``PYTEST_DONT_REWRITE``). So with the plugin named in a conftest, the way to load it
    where plugins are not loaded by themselves."""
    pytester.makepyfile(test_suite=SUITE)
    if loaded_by == "conftest":
        pytester.makeconftest('pytest_plugins = ["pytest_mailbox.plugin"]')
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    out = _drive(
        pytester.path,
        f"""
import sys
import pytest
import pytest_mailbox
import pytest_mailbox.plugin

for _ in range(2):
    code = pytest.main([*{BLOCKED!r}, "-p", "no:cacheprovider", "-W", "error", "-q"])
    print("exit", int(code))
""",
    )
    assert out.count("exit 0") == 2, out
    assert "PytestAssertRewriteWarning" not in out


@pytest.mark.parametrize(
    ("conftest", "args"),
    [
        ('pytest_plugins = ["pytest_mailbox.plugin"]', ()),
        ("", ("-p", "pytest_mailbox.plugin")),
        ("", ("-p", "mailbox")),
        ('pytest_plugins = ["pytest_mailbox.plugin"]', ("-p", "mailbox")),
    ],
    ids=["conftest", "-p module", "-p mailbox", "conftest and -p mailbox"],
)
@pytest.mark.parametrize("autoload", [True, False], ids=["autoload", "no autoload"])
def test_the_plugin_named_beside_its_entry_point_is_loaded_once(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    conftest: str,
    args: tuple[str, ...],
    autoload: bool,
) -> None:
    """Naming the plugin, as a project does for runs with ``PYTEST_DISABLE_PLUGIN_AUTOLOAD``
    (many CI setups), in a conftest or with ``-p``, while its entry point loads it too: the
    run was an INTERNALERROR, ``ValueError: Plugin already registered under a different
    name`` (the module was both ``mailbox`` and ``pytest_mailbox.plugin``)."""
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*args)
    result.assert_outcomes(passed=1)
    assert "already registered" not in result.stdout.str() + result.stderr.str()


def test_without_autoload_and_unnamed_the_plugin_is_off(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``PYTEST_DISABLE_PLUGIN_AUTOLOAD=1`` loads no entry point: ``-p mailbox`` (or the
    conftest line) is what turns it on, as the docs say."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest()
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'isolated_mailbox' not found*"])


@pytest.mark.parametrize(
    "args",
    [("-p", "no:mailbox"), ("-p", "no:pytest_mailbox.plugin"), ("-p", "no:mailbox", "-n", "2")],
    ids=["-p no:mailbox", "-p no:module", "-p no:mailbox -n 2"],
)
@pytest.mark.parametrize("autoload", [True, False], ids=["autoload", "no autoload"])
def test_the_plugin_named_in_a_conftest_is_off_under_p_no_mailbox(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    args: tuple[str, ...],
    autoload: bool,
) -> None:
    """A project that names the plugin in its conftest, as docs/configuration.md says to
    load it without autoload, and turns it off for a run with ``-p no:mailbox``, as the
    docs and the plugin's own usage errors say: the conftest loaded it under the module's
    name all the same (a sink, a store, receipts)."""
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        args = (*args, "-p", "xdist") if "-n" in args else args
    pytester.makeconftest('pytest_plugins = ["pytest_mailbox.plugin"]')
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest(*args)
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(["*fixture 'isolated_mailbox' not found*"])
    result.stdout.no_fnmatch_line("mailbox: *")  # no header, no counts: no sink, no store


KEEPING_SUITE = """
import os
import smtplib
import sys

import pytest

KEPT = sys.modules.setdefault("kept_from_session_one", type(sys)("kept_from_session_one"))


def test_keep(isolated_mailbox, mailbox_server, mailbox_store):
    if hasattr(KEPT, "mailbox"):
        pytest.skip("kept in the first session")
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        mail = "Subject: Code\\r\\n\\r\\n482913\\r\\n"
        smtp.sendmail("noreply@app.example.test", [isolated_mailbox.address], mail)
    KEPT.message = isolated_mailbox.wait_for(subject="Code", timeout=10)
    KEPT.mailbox, KEPT.store = isolated_mailbox, mailbox_store
    KEPT.tools = isolated_mailbox.agent_tools()


def _open_on(path):
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(path)):
            found.append(target)
    return found


def test_use(isolated_mailbox):
    if not hasattr(KEPT, "used"):
        KEPT.used = True
        pytest.skip("the first session keeps")
    old = KEPT.store.path
    for name, call in [
        ("ack", lambda: KEPT.message.ack()),
        ("checkpoint", lambda: KEPT.mailbox.checkpoint()),
        ("wait_for", lambda: KEPT.mailbox.wait_for(subject="Code", timeout=1)),
        ("reserve", lambda: KEPT.store.reserve(run_id="r-1", purpose="x", ttl=60, domain="m.test")),
        ("stats", lambda: KEPT.store.stats()),
    ]:
        try:
            answer = call()
        except Exception as exc:
            print(f"{name}: {type(exc).__name__}: {exc}")
        else:
            print(f"{name}: answered {answer!r}")
    answer = KEPT.tools.call("wait_for_message", {"fixture_id": KEPT.mailbox.mailbox_id})
    print(f"agent: {answer['status']}")
    print(f"open on the old store: {len(_open_on(old))}")
"""


def test_what_a_session_kept_refuses_in_the_next_and_opens_nothing(
    pytester: pytest.Pytester,
) -> None:
    """A mailbox, a claimed message, the store and an agent toolset kept from one
    ``pytest.main`` (a module's global, a notebook's variable) and used in the next: the
    store reopened its connections on the first session's file, for the rest of the
    process, and answered from it: a reservation there got an address no sink serves. Each
    now refuses with an error that names the session's end and the fix."""
    pytester.makepyfile(test_keep=KEEPING_SUITE)
    out = _drive(
        pytester.path,
        f"""
import pytest

for _ in range(2):
    code = pytest.main([*{BLOCKED!r}, "-p", "no:cacheprovider", "-W", "error", "-q", "-s"])
    print("exit", int(code))
""",
    )
    assert out.count("exit 0") == 2, out
    ended = "served a pytest session that has ended"
    for name in ("ack", "checkpoint", "wait_for", "reserve", "stats"):
        assert f"{name}: StoreError: the store " in out, out
    assert out.count(ended) == 5, out
    assert "isolated_mailbox" in out.split(ended, 1)[1].split("\n", 1)[0]
    assert "agent: provider_error" in out, out
    assert "open on the old store: 0" in out, out


FAILED_START = """
import os

import pytest


@pytest.hookimpl(wrapper=True)
def pytest_sessionstart(session):
    yield
    if os.environ.get("FAIL_AT_START"):
        raise RuntimeError("a plugin failed after pytest-mailbox's sessionstart")
"""


def test_a_session_that_fails_after_the_fixed_port_sink_started_frees_the_port(
    pytester: pytest.Pytester, fixed_port: int
) -> None:
    """An error raised after the plugin's ``pytest_sessionstart`` (another plugin's, a hook
    wrapper's) ends the session with an INTERNALERROR, and pytest calls no
    ``pytest_sessionfinish``, which stops fixed-port mode's sink: its thread served the
    retired store and held the port, so the next ``pytest.main`` of the process stopped
    at a usage error ("the port is already in use")."""
    pytester.makeconftest(FAILED_START)
    pytester.makepyfile(test_mail=SESSIONS_SUITE)
    out = _drive(
        pytester.path,
        f"""
import os
import threading

import pytest

args = [*{BLOCKED!r}, "-p", "no:cacheprovider", "-W", "error", "-q"]
args += ["--mailbox-port", "{fixed_port}"]
os.environ["FAIL_AT_START"] = "1"
print("first exit", int(pytest.main(args)))
del os.environ["FAIL_AT_START"]
print("threads", sorted(t.name for t in threading.enumerate()))
print("second exit", int(pytest.main(args)))
""",
    )
    assert "first exit 3" in out, out
    assert "threads ['MainThread']" in out, out
    assert "second exit 0" in out, out


SESSIONS_SUITE = """
import os
import smtplib
import sys

SEEN = sys.modules.setdefault("seen_by_the_sessions", type(sys)("seen_by_the_sessions"))


def test_mail(isolated_mailbox, mailbox_server, email_contract):
    SEEN.ports = [*getattr(SEEN, "ports", []), mailbox_server.port]
    SEEN.addresses = [*getattr(SEEN, "addresses", []), isolated_mailbox.address]
    SEEN.ttls = [*getattr(SEEN, "ttls", []), email_contract.ttl]
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        mail = "Subject: Hi\\r\\n\\r\\nx\\r\\n"
        smtp.sendmail("noreply@app.example.test", [isolated_mailbox.address], mail)
    isolated_mailbox.wait_for(subject="Hi", timeout=10).ack()
    if os.environ.get("INTERRUPT_IN_TEST"):
        raise KeyboardInterrupt
"""

SESSIONS_DRIVER = """
import gc
import os
import socket
import sys
import threading

import pytest

BLOCKED = {blocked!r}
PORT = {port!r}


def held():
    gc.collect()
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            found.append(os.readlink(f"/proc/self/fd/{{fd}}"))
        except OSError:  # listdir's own, closed since
            continue
    return sorted(t.name for t in threading.enumerate()), sorted(found)


def session(*args, interrupt=False):
    if interrupt:
        os.environ["INTERRUPT_IN_TEST"] = "1"
    try:
        code = pytest.main([*BLOCKED, "-p", "no:cacheprovider", "-W", "error", "-q", *args])
    finally:
        os.environ.pop("INTERRUPT_IN_TEST", None)
    return int(code)


def refused(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


print("warm-up", session())
before = held()
seen = sys.modules["seen_by_the_sessions"]
runs = [
    ("ttl", ("-o", "mailbox_ttl=77"), False),
    ("bad ini", ("-o", "mailbox_ttl_max=banana"), False),
    ("off", ("-p", "no:mailbox"), False),
    ("interrupted", (), True),
    ("fixed port interrupted", ("--mailbox-port", str(PORT)), True),
    ("fixed port", ("--mailbox-port", str(PORT)), False),
    ("receipts 1", ("--mailbox-receipts", "r1.jsonl"), False),
    ("receipts 2", ("--mailbox-receipts", "r2.jsonl"), False),
]
for name, args, interrupt in runs:
    code = session(*args, interrupt=interrupt)
    free = refused(seen.ports[-1])
    print(name, "exit", code, "same as before", held() == before, "port free", free)
print("ttls", seen.ttls)
print("addresses", len(seen.addresses), len(set(seen.addresses)))
print("ports", seen.ports)
"""


def test_sessions_in_a_row_in_one_process_each_take_their_options_and_leave_nothing(
    pytester: pytest.Pytester, fixed_port: int
) -> None:
    """``pytest.main`` again and again in one process, as an IDE or a notebook does: each
    session gets its own options (ttl, fixed port, receipts file), one that a bad ini
    value, ``-p no:mailbox`` or a Ctrl-C in a test ended included; after each, the process
    holds the threads and file descriptors it held before, and the session's port is free
    (fixed-port mode's, taken again by the next session)."""
    pytester.makepyfile(test_mail=SESSIONS_SUITE)
    out = _drive(pytester.path, SESSIONS_DRIVER.format(blocked=BLOCKED, port=fixed_port))
    assert "warm-up 0" in out, out
    for name, code in [
        ("ttl", 0),
        ("bad ini", 4),
        ("off", 1),
        ("interrupted", 2),
        ("fixed port interrupted", 2),
        ("fixed port", 0),
        ("receipts 1", 0),
        ("receipts 2", 0),
    ]:
        assert f"{name} exit {code} same as before True port free True" in out, out
    assert "ttls [300, 77, 300, 300, 300, 300, 300]" in out, out
    assert "addresses 7 7" in out, out
    ports = out.split("ports ", 1)[1].split("\n", 1)[0]
    assert ports.count(str(fixed_port)) == 2, out
    for receipts in ("r1.jsonl", "r2.jsonl"):
        assert len((pytester.path / receipts).read_text().splitlines()) == 1


NESTING_SUITE = """
import smtplib

INNER = "def test_inner(isolated_mailbox):\\n    pass\\n"


def test_outer(isolated_mailbox, mailbox_server, pytester):
    with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
        mail = "Subject: Reset\\r\\n\\r\\nhttps://app.example.test/reset/48291375\\r\\n"
        smtp.sendmail("noreply@app.example.test", [isolated_mailbox.address], mail)
    link = isolated_mailbox.wait_for(subject="Reset", timeout=10).link()
    pytester.makepyfile(test_inner=INNER)
    blocked = ("-p", "no:asyncio", "-p", "no:randomly", "-p", "no:pytest-retry")
    pytester.runpytest(*blocked).assert_outcomes(passed=1)
    assert link == "https://app.example.test/reset/other"
"""


def test_a_session_run_inside_a_test_leaves_that_tests_report_masked(
    pytester: pytest.Pytester,
) -> None:
    """A test that runs a pytest session in its own process (``pytester.runpytest``,
    ``inline_run``: a plugin's own tests) after it extracted a link: the inner session's
    first test emptied what the process masks for the running test, and the outer test's
    report showed the link's token (``/reset/48291375``) in clear."""
    pytester.makepyfile(test_nest=NESTING_SUITE)
    result = pytester.runpytest_subprocess(*BLOCKED, "-p", "pytester")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    assert "48291375" not in out
    result.stdout.fnmatch_lines(["*AssertionError*eset/••••••75*"])


@pytest.mark.parametrize(
    ("conftest", "args", "autoload"),
    [
        ('pytest_plugins = ["pytest_mailbox.plugin"]', (), True),
        ("", ("-p", "pytest_mailbox.plugin"), True),
        ("", ("-p", "xdist", "-p", "mailbox"), False),
    ],
    ids=["conftest", "-p module", "no autoload, -p mailbox"],
)
def test_the_plugin_named_beside_its_entry_point_under_xdist(
    pytester: pytest.Pytester,
    monkeypatch: pytest.MonkeyPatch,
    conftest: str,
    args: tuple[str, ...],
    autoload: bool,
) -> None:
    """As above, with xdist's workers, which load the plugins as the controller does."""
    if not autoload:
        monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    if conftest:
        pytester.makeconftest(conftest)
    pytester.makepyfile(test_suite=SUITE + SUITE.replace("test_mail", "test_mail_too"))
    result = pytester.runpytest(*args, "-n", "2")
    result.assert_outcomes(passed=2)
