"""Read receipts back from JUnit XML or JSON Lines, and print them as a table."""

from __future__ import annotations

import argparse
import stat
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from pytest_mailbox.vocabulary import CloseReason, Status

if TYPE_CHECKING:  # the plugin imports this module in every process: pydantic on first use
    from pytest_mailbox.contract import Receipt

__all__ = ["RECEIPT_PROPERTY", "format_table", "main", "read_receipts"]

RECEIPT_PROPERTY = "mailbox.receipt"
#: The states a mailbox (so a receipt) can be in: a receipt's mailbox is closed
#: (released or expired) unless it could not be, as when the store file was replaced.
_MAILBOX_STATES = [
    s.value
    for s in (Status.RESERVED, Status.WAITING, Status.CLAIMED, Status.CONSUMED, Status.RELEASED)
] + [Status.EXPIRED.value]


def parse_receipt(value: str) -> Receipt | None:
    """The receipt a ``mailbox.receipt`` value holds; None if it holds something else (a
    test may record a property of that name itself)."""
    from pydantic import ValidationError  # noqa: PLC0415 - see TYPE_CHECKING above

    from pytest_mailbox.contract import Receipt  # noqa: PLC0415

    try:
        return Receipt.model_validate_json(value)
    except ValidationError:
        return None


def read_receipts(path: str | Path) -> list[Receipt]:
    """Every receipt in a JUnit XML file (``<property name="mailbox.receipt">``) or JSONL file.

    A JUnit property of that name that holds no receipt (a test recorded its own) is
    skipped; a JSON Lines file holds receipts only, and a line that is not one raises
    ``ValueError`` naming it, as does XML that is not a JUnit report.
    """
    from pydantic import ValidationError  # noqa: PLC0415 - see TYPE_CHECKING above

    from pytest_mailbox.contract import Receipt  # noqa: PLC0415

    path = Path(path)
    text = path.read_text(encoding="utf-8-sig")  # a BOM a tool that re-saved it may add
    if text.lstrip().startswith("<"):
        root = ET.fromstring(text)
        if root.tag not in ("testsuites", "testsuite"):  # an HTML report, say: not 0 runs
            msg = (
                f"XML whose root is <{root.tag}>, not a JUnit report's <testsuites> or <testsuite>"
            )
            raise ValueError(msg)
        parsed = (
            parse_receipt(prop.get("value", ""))
            for prop in root.iter("property")
            if prop.get("name") == RECEIPT_PROPERTY
        )
        return [receipt for receipt in parsed if receipt is not None]
    # Lines end at "\n" only: a subject may hold U+0085, U+2028 or U+2029, which JSON
    # leaves as they are and str.splitlines() would break a line at.
    receipts = []
    for number, line in enumerate(text.split("\n"), start=1):
        if line.strip():
            try:
                receipts.append(Receipt.model_validate_json(line))
            except ValidationError as exc:  # which line: a file may hold thousands
                first = str(exc).splitlines()[0]
                msg = f"line {number} is not a receipt ({first})"
                raise ValueError(msg) from None
    return receipts


def format_table(receipts: Iterable[Receipt], shown: Callable[[str], str] | None = None) -> str:
    """One row per run: test, address, state and close reason, messages received/consumed.

    ``shown`` gives a cell as it will be printed (escaped for a stdout's encoding): the
    columns are as wide as what is printed."""
    header = ("test", "run_id", "address", "state", "close_reason", "msgs", "consumed")
    rows: list[Sequence[str]] = [header]
    for r in receipts:
        consumed = sum(1 for m in r.messages if m.state == "consumed")
        row = (
            r.nodeid,
            r.run_id,
            r.address,
            r.state,
            r.close_reason or "-",
            str(len(r.messages)),
            str(consumed),
        )
        rows.append(row if shown is None else [shown(cell) for cell in row])
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``python -m pytest_mailbox receipts FILE...``: print the receipts as a table."""
    out = out or sys.stdout
    parser = argparse.ArgumentParser(
        prog="python -m pytest_mailbox",
        description="Read back the receipts pytest-mailbox left (docs/receipts.md).",
        epilog="'python -m pytest_mailbox receipts --help' says what the command takes.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    show = commands.add_parser(
        "receipts",
        help="Print the receipts in JUnit XML or JSONL files",
        description="Print the receipts in JUnit XML or JSON Lines files as a table, one "
        "row per run; a run found in several files is listed once.",
    )
    show.add_argument(
        "files",
        nargs="+",
        type=Path,
        metavar="FILE",
        help="A JUnit XML report (pytest --junitxml) or a JSON Lines file of receipts "
        "(--mailbox-receipts)",
    )
    test = show.add_argument(
        "--test", default="", metavar="TEXT", help="Only runs whose test id contains this text"
    )
    states = [*_MAILBOX_STATES, *(r.value for r in CloseReason)]
    state = show.add_argument(
        "--state",
        default="",
        choices=states,
        metavar="STATE",
        help="Only runs whose mailbox ended in this state or for this close reason, e.g. "
        f"expired or released_error (one of: {', '.join(states)})",
    )
    timeline = show.add_argument(
        "--timeline", action="store_true", help="Print each run's timeline too"
    )
    options = {name for action in (test, state, timeline) for name in action.option_strings}
    args, unknown = parser.parse_known_args(argv)
    if args.command is None:  # argparse would say "required: COMMAND", naming none
        parser.error("give a command: receipts (python -m pytest_mailbox receipts --help)")
    if unknown:  # said by the command's parser, so its usage is the one shown
        known = [arg for arg in unknown if arg.split("=", 1)[0] in options]
        hint = f" ({', '.join(known)}: options go after 'receipts')" if known else ""
        show.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    # A run_id names one run of one test: the JUnit XML and the JSON Lines of one pytest run
    # hold the same receipts, so a run given in both is listed once.
    receipts: dict[str, Receipt] = {}
    for file in args.files:
        try:
            # os.stat, not is_file(): that raises for a folder this user may not search
            # (Python 3.12 and older), or a name too long, and says False on 3.13.
            mode = file.stat().st_mode
        except FileNotFoundError:
            show.error(f"{file}: no such file")
        except NotADirectoryError:
            show.error(f"{file}: no such file (a part of its path is a file)")
        except OSError as exc:
            show.error(f"{file}: cannot be read ({exc.strerror or exc})")
        if not stat.S_ISREG(mode):
            show.error(f"{file}: not a file")
        try:
            for receipt in read_receipts(file):
                receipts.setdefault(receipt.run_id, receipt)
        except (ValueError, ET.ParseError) as exc:  # ValidationError is a ValueError
            first = str(exc).splitlines()[0]
            show.error(f"{file}: not JUnit XML or pytest-mailbox JSON Lines receipts ({first})")
        except OSError as exc:  # a file this user may not read, an I/O error
            show.error(f"{file}: cannot be read ({exc.strerror or exc})")
    chosen = [
        r
        for r in receipts.values()
        if args.test in r.nodeid and args.state in ("", r.state, r.close_reason)
    ]
    out.write(format_table(chosen, shown=lambda cell: printable(cell, out)) + "\n")
    if args.timeline:
        for receipt in chosen:
            out.write(printable("\n" + receipt.timeline() + "\n", out))
    out.write(f"{len(chosen)} receipt(s)\n")
    return 0


def printable(text: str, out: object) -> str:
    """``text`` as the stream ``out`` can write it: a character its encoding lacks as a
    backslash escape (``verificaci\\xf3n``, ``\\u2022\\u2022\\u2022\\u202213``), as pytest
    shows one. A stdout in ASCII (``LC_ALL=C`` with ``PYTHONUTF8=0``,
    ``PYTHONIOENCODING=ascii``) or in a code page (cp1252: Windows', piped) raised
    ``UnicodeEncodeError`` for a test's id, a selector or a mask."""
    encoding = getattr(out, "encoding", None)
    if not isinstance(encoding, str):
        return text
    errors = getattr(out, "errors", None)
    try:
        text.encode(encoding, errors if isinstance(errors, str) else "strict")
    except UnicodeEncodeError:
        return text.encode(encoding, "backslashreplace").decode(encoding)
    except LookupError:  # an encoding (or errors handler) Python does not know: as it is
        return text
    return text
