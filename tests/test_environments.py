"""The plugin's output where CI runners and developers run it: a stdout that is not UTF-8
(an ASCII or a latin-1 one), time zones, terminals of any width and colour, a JUnit XML
report read by a strict parser."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
import xml.etree.ElementTree as ET

import pytest
from test_plugin import SENDER_CONFTEST

from pytest_mailbox.receipts import read_receipts

#: A stdout that cannot write every character: what sets it, and how pytest then escapes
#: "✓" (U+2713, in neither ASCII nor latin-1). Python's locale encoding is ASCII under
#: the C locale when neither UTF-8 mode nor locale coercion steps in.
NARROW_STDOUTS: dict[str, dict[str, str | None]] = {
    "ascii": {"PYTHONIOENCODING": "ascii"},
    "latin-1": {"PYTHONIOENCODING": "latin-1"},
    "C locale": {
        "LC_ALL": "C",
        "LANG": "C",
        "PYTHONUTF8": "0",
        "PYTHONCOERCECLOCALE": "0",
        "PYTHONIOENCODING": None,
    },
}

#: A test that waits with a selector the timeline shows ("✓" written as an escape, so
#: that pytest's copy of the source is ASCII), prints the link (masked: "…", "•"), and
#: fails once it holds the message.
CLAIMS_THEN_FAILS = """
SUBJECT = "Verify \\u2713 your account"


def test_claims_then_fails(isolated_mailbox, send):
    send(isolated_mailbox.address, subject=SUBJECT)
    msg = isolated_mailbox.wait_for(subject_contains="\\u2713")
    print("opening", msg.link())
    print("and that was all")
    assert False, "the app refused the link"
"""


@pytest.fixture(params=list(NARROW_STDOUTS))
def narrow_stdout(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The environment of a run whose stdout cannot write "✓"; its name."""
    for name, value in NARROW_STDOUTS[request.param].items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    return str(request.param)


@pytest.mark.parametrize(
    ("narrow_stdout", "workers"),
    [("ascii", "0"), ("ascii", "2"), ("latin-1", "0"), ("C locale", "0")],
    indirect=["narrow_stdout"],
)
def test_a_timeline_keeps_one_event_a_line_on_a_stdout_that_cannot_show_its_characters(
    pytester: pytest.Pytester, narrow_stdout: str, workers: str
) -> None:
    """pytest writes a section in one piece, and all of it escaped if its stream cannot
    encode one character: the timeline was one line, its line breaks a literal ``\\n``,
    and so was the test's own output once the plugin's mask was in it."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(CLAIMS_THEN_FAILS)

    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-n", workers)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        [
            "*- mailbox -*",
            "mailbox mail-*@mailbox.test (mbx-*, run r-*, purpose mail): claimed",
            "  +*s  reserved * fence *",
            "  +*s  received *m-*",
            "  +*s  waiting          subject_contains='\\u2713'",
            "  +*s  claimed          m-* fence *",
        ],
        consecutive=True,
    )
    # The test's own output, ASCII but for the mask of the link it printed: one section.
    result.stdout.fnmatch_lines(
        ["*- Captured stdout call -*", "opening *", "and that was all"], consecutive=True
    )
    assert "s3cr3t" not in result.stdout.str()


def test_the_receipts_command_escapes_what_stdout_cannot_show(
    pytester: pytest.Pytester, narrow_stdout: str
) -> None:
    """``python -m pytest_mailbox receipts --timeline`` on a stdout in ASCII or latin-1
    ended in a UnicodeEncodeError traceback at the first selector, or test id, with "✓"."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(CLAIMS_THEN_FAILS)
    pytester.runpytest("--mailbox-receipts=r.jsonl", "--junitxml=junit.xml").assert_outcomes(
        failed=1
    )

    for name in ("r.jsonl", "junit.xml"):
        command = [sys.executable, "-m", "pytest_mailbox", "receipts", name, "--timeline"]
        proc = subprocess.run(
            command, cwd=pytester.path, capture_output=True, check=False, timeout=60
        )

        assert proc.stderr == b""
        assert proc.returncode == 0
        lines = proc.stdout.decode("ascii").splitlines()
        assert lines[-1] == "1 receipt(s)"
        assert (
            sum(line.endswith("  waiting          subject_contains='\\u2713'") for line in lines)
            == 1
        )


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_subject_with_characters_xml_forbids_reads_back_the_same_from_junit_xml(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest writes DEL, U+FFFE and U+FFFF in a property's value as the text ``#x7F``
    (XML 1.0 forbids the last two): the receipt read back from JUnit XML had another
    subject than the JSON Lines file's. They are JSON escapes in the receipt now."""
    subject = "Verify\x7f now\ufffe or\uffff later \x1b[0m \x0b\x85\u2028 \U0001d4b3"
    pytester.makepyfile(
        f"""
        import base64
        import smtplib

        SUBJECT = {subject!r}

        def test_odd_subject(isolated_mailbox, mailbox_server):
            to = isolated_mailbox.address
            word = base64.b64encode(SUBJECT.encode()).decode()
            head = f"To: {{to}}\\r\\nSubject: =?utf-8?b?{{word}}?=\\r\\n"
            with smtplib.SMTP(mailbox_server.host, mailbox_server.port) as smtp:
                smtp.sendmail("app@example.test", [to], (head + "\\r\\nhi\\r\\n").encode())
            assert isolated_mailbox.wait_for(subject_contains="Verify").subject == SUBJECT
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=r.jsonl")
    result.assert_outcomes(passed=1)

    ET.parse(pytester.path / "junit.xml")  # well-formed
    for name in ("junit.xml", "r.jsonl"):
        (receipt,) = read_receipts(pytester.path / name)
        assert [m.subject for m in receipt.messages] == [subject]


#: pytest 8.1 to 9.0's ``bin_xml_escape`` (pytest-dev/pytest#14483, fixed in 9.1): its
#: set of legal characters ends at ``\u1000`` ``0-\u10ff`` ``ff``, so that every character
#: past U+FFFF (an emoji) is written ``#x1F389`` in a property's value.
PYTEST_9_0_JUNIT_ESCAPE = """
import re

import _pytest.junitxml


def bin_xml_escape(arg):
    def repl(found):
        i = ord(found.group())
        return "#x%02X" % i if i <= 0xFF else "#x%04X" % i

    illegal = (
        "[^\\u0009\\u000a\\u000d\\u0020-\\u007e"
        "\\u0080-\\ud7ff\\ue000-\\ufffd\\u10000-\\u10ffff]"
    )
    return re.sub(illegal, repl, str(arg))


_pytest.junitxml.bin_xml_escape = bin_xml_escape
"""


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_subject_with_an_emoji_reads_back_the_same_from_the_junit_xml_of_pytest_9_0(
    pytester: pytest.Pytester, workers: str
) -> None:
    """pytest before 9.1 (the plugin's floor is 8.1) writes every character past U+FFFF
    in a property's value as the text ``#x1F389``: a receipt read back from JUnit XML had
    ``#x1F389 Welcome`` for the subject the JSON Lines file has as ``\U0001f389 Welcome``.
    Such a character is a JSON escape in the receipt (a surrogate pair), as DEL is."""
    subject = "\U0001f389 Welcome, \U0001d4b3"
    pytester.makeconftest(SENDER_CONFTEST + PYTEST_9_0_JUNIT_ESCAPE)
    pytester.makepyfile(
        f"""
        SUBJECT = {subject!r}

        def test_emoji_subject(isolated_mailbox, send):
            send(isolated_mailbox.address, subject=SUBJECT)
            assert isolated_mailbox.wait_for(subject_contains="Welcome").subject == SUBJECT
        """
    )
    result = pytester.runpytest("-n", workers, "--junitxml=junit.xml", "--mailbox-receipts=r.jsonl")
    result.assert_outcomes(passed=1)

    assert "#x1F389" not in (pytester.path / "junit.xml").read_text(encoding="utf-8")
    for name in ("junit.xml", "r.jsonl"):
        (receipt,) = read_receipts(pytester.path / name)
        assert [m.subject for m in receipt.messages] == [subject]


def test_the_receipts_table_keeps_its_columns_when_a_test_id_is_escaped(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cell is measured as it is printed: ``test_\\u03bb`` is 5 characters longer than
    ``test_λ``, and pushed the rest of its row out of its columns."""
    pytester.makepyfile(
        "def test_\u03bb(isolated_mailbox):\n    pass\n\n"
        "def test_plain(isolated_mailbox):\n    pass\n"
    )
    pytester.runpytest("--mailbox-receipts=r.jsonl").assert_outcomes(passed=2)
    monkeypatch.setenv("PYTHONIOENCODING", "ascii")

    command = [sys.executable, "-m", "pytest_mailbox", "receipts", "r.jsonl"]
    proc = subprocess.run(command, cwd=pytester.path, capture_output=True, check=True, timeout=60)

    header, rule, *rows, total = proc.stdout.decode("ascii").splitlines()
    assert total == "2 receipt(s)"
    assert any("::test_\\u03bb " in row for row in rows)
    starts = [header.index("run_id"), rule.index(" -") + 1]
    assert all(row.index("  r-") + 2 == starts[0] for row in rows)
    assert starts[0] == starts[1]


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_run_that_makes_default_encodings_warn_gets_no_warning_from_the_plugins_searches(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, workers: str
) -> None:
    """``PYTHONWARNDEFAULTENCODING=1`` (PEP 597, for a CI that hunts ``open()`` without an
    encoding) makes ``locale.getpreferredencoding()`` warn, and the regex package the
    plugin's searches run on calls it for each new pattern: under ``-W error`` a test's
    ``code()`` or ``subject_regex`` failed with an EncodingWarning about the plugin's
    own dependency. A test's own default encoding still warns."""
    monkeypatch.setenv("PYTHONWARNDEFAULTENCODING", "1")
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        """
        import locale

        import pytest


        def test_code_and_pattern(isolated_mailbox, send):
            send(isolated_mailbox.address, body="Your code is 482913.")
            msg = isolated_mailbox.wait_for(subject_regex=r"^Verify\\b")
            assert msg.code() == "482913"
            assert msg.code(pattern=r"code is (\\d{6})") == "482913"
            msg.ack()


        def test_own_default_encoding_still_warns():
            with pytest.warns(EncodingWarning):
                locale.getpreferredencoding(False)
        """
    )

    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-n", workers, "-W", "error")

    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("narrow_stdout", ["C locale"], indirect=True)
def test_a_test_in_a_folder_whose_name_the_locale_cannot_decode_gets_its_mailbox(
    pytester: pytest.Pytester, narrow_stdout: str
) -> None:
    """Python decodes a path it cannot read in the locale's encoding with surrogates
    (``café`` under ``LC_ALL=C`` without UTF-8 mode is ``caf\\udcc3\\udca9``), and pytest's
    node id keeps them: SQLite and JSON take none, and the test errored at setup with
    ``UnicodeEncodeError: ... surrogates not allowed``. Its receipt names it ``café``."""
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(
        **{
            "caf\u00e9/test_mail": """
            def test_it(isolated_mailbox, send):
                send(isolated_mailbox.address)
                isolated_mailbox.wait_for(subject_contains="Verify").ack()
            """
        }
    )

    # pytest's own cache and JUnit XML fail on such an id at the run's end (they write it
    # as UTF-8 too): left out here.
    result = pytester.runpytest_subprocess(
        "-p", "no:asyncio", "-p", "no:cacheprovider", "--mailbox-receipts=r.jsonl"
    )

    result.assert_outcomes(passed=1)
    (receipt,) = read_receipts(pytester.path / "r.jsonl")
    assert receipt.nodeid == "caf\u00e9/test_mail.py::test_it"
    assert receipt.close_reason == "released_success"


def test_the_receipts_command_stops_quietly_when_its_reader_stops_reading(
    pytester: pytest.Pytester,
) -> None:
    """``python -m pytest_mailbox receipts FILE --timeline | head`` in a CI step: once
    ``head`` has its lines and closes the pipe, the command printed a BrokenPipeError
    traceback (and another as Python flushed stdout at exit) over the step's log. It
    stops as Python's own documentation says a command should: no traceback, status 1.
    (The pipe's reader is closed before the command starts, so that its first write fails.)
    """
    pytester.makeconftest(SENDER_CONFTEST)
    pytester.makepyfile(CLAIMS_THEN_FAILS)
    pytester.runpytest("--mailbox-receipts=r.jsonl").assert_outcomes(failed=1)
    read, write = os.pipe()
    os.close(read)

    command = [sys.executable, "-m", "pytest_mailbox", "receipts", "r.jsonl", "--timeline"]
    try:
        proc = subprocess.run(
            command,
            cwd=pytester.path,
            stdout=write,
            stderr=subprocess.PIPE,
            check=False,
            timeout=60,
        )
    finally:
        os.close(write)

    assert proc.stderr == b""
    assert proc.returncode == 1


def test_a_search_in_another_thread_leaves_the_tests_warnings_filters_as_they_are(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``PYTHONWARNDEFAULTENCODING=1`` the plugin's searches ignored the regex
    package's EncodingWarning with ``warnings.catch_warnings``, which saves and restores
    the process's filters: a search in another thread (an agent's call, the sink's) undid,
    as it ended, a filter the test set meanwhile, and a ``pytest.warns`` block entered
    meanwhile lost its recording and caught the plugin's own EncodingWarning. The search
    is held on events, as a slow one is, so that the test goes on beside it."""
    monkeypatch.setenv("PYTHONWARNDEFAULTENCODING", "1")
    pytester.makepyfile(
        """
        import threading
        import warnings

        import pytest

        from pytest_mailbox.contract import regex_search


        @pytest.fixture
        def held_search(monkeypatch):
            assert regex_search("a", "a")  # the plugin imports regex
            import regex

            inside, go, real = threading.Event(), threading.Event(), regex.search

            def held(*args, **kwargs):
                inside.set()
                go.wait()
                return real(*args, **kwargs)

            monkeypatch.setattr(regex, "search", held)
            found = []
            searcher = threading.Thread(target=lambda: found.append(regex_search("b", "abc")))
            searcher.start()
            inside.wait()

            def end():
                go.set()
                searcher.join()
                assert found == [True]

            return end


        def test_a_filter_set_beside_a_search(held_search):
            warnings.filterwarnings("ignore", message="known and harmless")
            held_search()
            warnings.warn("known and harmless", UserWarning)


        def test_pytest_warns_beside_a_search(held_search):
            with pytest.warns(UserWarning, match="deprecated"):
                held_search()
                warnings.warn("deprecated", UserWarning)


        def test_regex_used_by_the_test_still_warns_from_regex():
            assert regex_search("c", "abc")
            import sys

            import regex

            with pytest.warns(EncodingWarning) as warned:
                regex.compile("the test's own pattern")
            module = sys.modules[regex.compile.__module__]  # regex._main, or regex.regex
            assert [w.filename for w in warned] == [module.__file__]
        """
    )

    result = pytester.runpytest_subprocess("-p", "no:asyncio", "-W", "error")

    result.assert_outcomes(passed=3)


@pytest.mark.parametrize("do_setlocale", [False, True])
def test_regex_is_answered_as_the_locale_answers_without_the_warning_in_a_search(
    do_setlocale: bool,
) -> None:
    """What the regex package is given for ``locale.getpreferredencoding`` under
    ``PYTHONWARNDEFAULTENCODING=1``: locale's answer, and its warning from the caller's
    frame, but in the plugin's own searches. regex asks with ``False``, and regex 2023
    (the floor below Python 3.13: ``regex.regex``, not ``regex._main``) with ``True``."""
    import locale  # noqa: PLC0415

    from pytest_mailbox import contract  # noqa: PLC0415

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", EncodingWarning)
        expected = locale.getpreferredencoding(do_setlocale)
    with pytest.warns(EncodingWarning, match="UTF-8 Mode affects") as warned:
        assert contract._preferred_encoding(do_setlocale) == expected
    assert [w.filename for w in warned] == [__file__]
    with contract._regex_quietly(), warnings.catch_warnings():
        warnings.simplefilter("error")
        assert contract._preferred_encoding(do_setlocale) == expected
