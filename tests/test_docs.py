"""The code the docs show is the code the suite runs.

The recipes, and getting-started's first test and its script without pytest, are shown
in the docs and run from ``docs/examples``. A change to either side alone would leave a
reader copying code that no test runs any more: every Python block of those pages must be
found, line by line and in order, in one file under ``docs/examples`` (a block may leave
out lines, such as a docstring, but not change or reorder one).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import pytest_mailbox
from pytest_mailbox import MailboxError, Status

DOCS = Path(__file__).resolve().parent.parent / "docs"
BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: The pages whose every Python block is an excerpt of an example the suite runs.
EXCERPTS = ("recipes.md",)
#: Pages of which only some blocks are excerpts: (page, position of the block).
SOME = (
    ("getting-started.md", 0),
    ("getting-started.md", 2),
    ("agents.md", 4),  # with the OpenAI Agents SDK: its FunctionTools
    ("agents.md", 5),  # and over MCP
)


def blocks(page: str) -> list[str]:
    return BLOCK.findall((DOCS / page).read_text(encoding="utf-8"))


def lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def is_excerpt(block: str, source: str) -> bool:
    """Every non-blank line of ``block`` is a line of ``source``, in the same order."""
    remaining = iter(lines(source))
    return all(any(line == candidate for candidate in remaining) for line in lines(block))


def excerpted() -> list[pytest.ParameterSet]:
    found = [(page, i, block) for page in EXCERPTS for i, block in enumerate(blocks(page))]
    found += [(page, i, blocks(page)[i]) for page, i in SOME]
    return [pytest.param(*case, id=f"{case[0]}-block{case[1] + 1}") for case in found]


EXAMPLES = sorted((DOCS / "examples").rglob("*.py"))


@pytest.mark.parametrize(("page", "index", "block"), excerpted())
def test_every_block_is_an_excerpt_of_an_example_the_suite_runs(
    page: str, index: int, block: str
) -> None:
    sources = [path for path in EXAMPLES if is_excerpt(block, path.read_text(encoding="utf-8"))]
    assert sources, (
        f"docs/{page}, Python block {index + 1}: no file under docs/examples holds it. "
        "Change the example and the page together."
    )


@pytest.mark.parametrize("page", [*EXCERPTS, *(page for page, _ in SOME)])
def test_every_python_fence_of_those_pages_is_checked(page: str) -> None:
    """A block fenced otherwise (```py, ```python3, indented in a list) would be skipped."""
    fences = re.findall(
        r"^[ \t]*```[ \t]*py", (DOCS / page).read_text(encoding="utf-8"), re.MULTILINE
    )
    assert len(fences) == len(blocks(page))


def test_a_changed_or_reordered_line_is_not_an_excerpt() -> None:
    source = "def f():\n    '''Doc.'''\n    a = 1\n\n    b = 2\n    return a + b\n"
    assert is_excerpt("def f():\n    a = 1\n    b = 2\n", source)  # a docstring left out
    assert not is_excerpt("def f():\n    a = 2\n", source)  # a changed line
    assert not is_excerpt("def f():\n    b = 2\n    a = 1\n", source)  # reordered


def test_the_exceptions_table_of_the_contract_page_is_what_each_exception_carries() -> None:
    """docs/contract.md tells which status each exception carries; a caller reads it back
    from ``.status`` (a ``str``: the word an agent's answer holds) and ``.result["status"]``.
    ``MailboxClosed`` says one of its three by the instance; the others, each its own."""
    page = (DOCS / "contract.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (`[A-Z].*?) \| (`[a-z_].*?) \|", page, re.MULTILINE)
    table: dict[str, list[str]] = {}
    for names, statuses in rows:
        for name, status in zip(names.split(" / "), statuses.split(" / "), strict=False):
            table[name.strip("`")] = [status.strip("`")]
    table["MailboxClosed"] = re.findall(r"`([a-z_]+)`", dict(rows)["`MailboxClosed`"])
    errors = {
        name: cls
        for name in pytest_mailbox.__all__
        if isinstance(cls := getattr(pytest_mailbox, name), type) and issubclass(cls, MailboxError)
    }
    assert set(table) == set(errors) - {"MailboxError"}
    for name, statuses in table.items():
        if name == "MailboxClosed":
            for status in statuses:
                closed = errors[name]("closed", status=Status(status))
                assert (closed.status, closed.result["status"]) == (status, status)
        else:
            (status,) = statuses
            refused = errors[name]("refused")
            assert (refused.status, refused.result["status"]) == (status, status), name


@pytest.mark.parametrize(
    ("name", "builtin"),
    [
        ("WaitTimeout", TimeoutError),  # except TimeoutError: around a wait
        ("UnexpectedMessage", AssertionError),  # pytest reports expect_none as a failed assert
        ("ContractError", ValueError),
        ("ExtractionError", ValueError),  # except ValueError: around link() or code()
        ("ExposedSinkWarning", UserWarning),  # filterwarnings = ignore::UserWarning, say
    ],
)
def test_each_exception_is_also_the_builtin_a_caller_catches(name: str, builtin: type) -> None:
    assert issubclass(getattr(pytest_mailbox, name), builtin)


def test_the_status_vocabulary_the_docs_list_is_the_code_s() -> None:
    """contract.md's "one vocabulary everywhere" and agents.md's `status` row list every
    status, in the enum's order; an agent's answer has those and `rejected`. A status
    added to (or renamed in) ``Status`` or the agent's ``Answer`` changes the pages too."""
    from typing import get_args  # noqa: PLC0415 - only here

    from pytest_mailbox.agent import Answer, NextAction  # noqa: PLC0415 - pydantic models

    statuses = [status.value for status in Status]
    # As read, whatever the lines' wrapping: a paragraph reflowed is the same page.
    contract = " ".join((DOCS / "contract.md").read_text(encoding="utf-8").split())
    (listed,) = re.findall(r"One vocabulary everywhere[^:`]*: `([a-z_, ]+)`", contract)
    assert [word.strip() for word in listed.split(",")] == statuses

    agents = (DOCS / "agents.md").read_text(encoding="utf-8")
    (row,) = re.findall(
        r"^\| `status` \| the contract's vocabulary \((.*?)\) plus (.*?) \|", agents, re.M
    )
    answered = get_args(Answer.model_fields["status"].annotation)
    assert [*re.findall(r"`([a-z_]+)`", row[0]), *re.findall(r"`([a-z_]+)`", row[1])] == list(
        answered
    )
    assert list(answered) == [*statuses, "rejected"]

    (hint,) = re.findall(r"^\| `next_action` \| (.*?) \|$", agents, re.M)
    assert re.findall(r'\{"do": "([a-z_]+)"', hint) == list(
        get_args(NextAction.model_fields["do"].annotation)
    )

    said = contract[contract.index("Close reasons: ") : contract.index("A mailbox released early")]
    reasons = dict.fromkeys(re.findall(r"`((?:released|expired)_[a-z]+)`", said))
    assert list(reasons) == [reason.value for reason in pytest_mailbox.CloseReason]


def test_the_limits_table_of_the_security_page_has_the_code_s_defaults() -> None:
    """docs/security.md lists each limit with its setting and default; a default changed
    in the code (an option's, a constant's) is changed on the page too."""
    from aiosmtpd.smtp import SMTP  # noqa: PLC0415 - only here

    from pytest_mailbox import endpoint, sink, store  # noqa: PLC0415
    from pytest_mailbox.settings import OPTIONS  # noqa: PLC0415

    page = (DOCS / "security.md").read_text(encoding="utf-8")
    rows = {
        limit: (setting, default)
        for limit, setting, default in re.findall(
            r"^\| ([A-Za-z][^|]*?) \| ([^|]*?) \| ([^|]*?) \|", page, re.MULTILINE
        )
    }
    option = {o.ini: o.default for o in OPTIONS}
    mib, kib = 1024 * 1024, 1024
    assert rows["message size"] == ("`mailbox_max_message_size`", "10 MiB")
    assert int(option["mailbox_max_message_size"]) == 10 * mib
    assert rows["header section"] == ("fixed (`HEADER_LIMIT`)", "256 KiB")
    assert 256 * kib == sink.HEADER_LIMIT
    assert rows["recipients per message"] == ("`mailbox_max_recipients`", "100")
    assert option["mailbox_max_recipients"] == str(endpoint.DEFAULT_MAX_RECIPIENTS) == "100"
    assert rows["idle client"] == ("`mailbox_idle_timeout`", "300 s")
    assert option["mailbox_idle_timeout"] == f"{endpoint.DEFAULT_IDLE_TIMEOUT:g}" == "300"
    assert rows["DATA line"][1] == "998 octets + CRLF"
    assert sink._MAX_DATA_LINE == 998
    assert rows["command line"][1].startswith(f"{SMTP.command_size_limit} octets")
    assert rows["WAL of the store"] == ("`Store(wal_limit=)`", "16 MiB")
    assert 16 * mib == store.WAL_LIMIT


def test_the_marker_s_registered_signature_has_the_contract_s_defaults(
    pytester: pytest.Pytester,
) -> None:
    """``pytest --markers`` shows ``email_contract(*, purpose='mail', ttl=min(300, …), …)``: each
    default as the contract has it, every field of it, in its order."""
    from pytest_mailbox.contract import EmailContract  # noqa: PLC0415 - pydantic models

    result = pytester.runpytest("--markers")

    (line,) = [line for line in result.outlines if line.startswith("@pytest.mark.email_contract")]
    (arguments,) = re.findall(r"email_contract\(\*, (.*?)\): ", line)
    expected = []
    for name, field in EmailContract.model_fields.items():
        default = field.default
        if name == "lease":  # unless given, at most the ttl
            written = f"min({default:g}, ttl)"
        elif name == "ttl":  # unless given, at most mailbox_ttl_max
            written = f"min({default}, mailbox_ttl_max)"
        elif isinstance(default, float):
            written = f"{default:g}"  # timeout=10, as a marker is written
        else:
            written = repr(default)
        expected.append(f"{name}={written}")
    assert arguments == ", ".join(expected)


def test_the_options_the_configuration_page_calls_contract_defaults_are_the_contract_s() -> None:
    """configuration.md: "The last eight rows are the defaults of every test's
    email_contract". Those rows are the options named as the contract's fields (all of them
    but run_header, which is the marker's only), and they come last."""
    from pytest_mailbox.settings import OPTIONS  # noqa: PLC0415

    page = (DOCS / "configuration.md").read_text(encoding="utf-8")
    words = {6: "six", 7: "seven", 8: "eight", 9: "nine", 10: "ten"}
    contract = [name for name in pytest_mailbox.EmailContract.model_fields if name != "run_header"]
    assert f"The last {words[len(contract)]} rows are the defaults" in page
    assert [option.name for option in OPTIONS[-len(contract) :]] == contract
