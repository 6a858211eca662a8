"""The client processes: ``python benchmarks/clients.py blast|feeder [options]``.

They import only the SMTP helpers (not pytest-mailbox), so they start fast and stay light.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make ``benchmarks`` importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.smtp import BlockingClient, blast, mail

HERE = Path(__file__).resolve().parent
CLIENT_ROLES = ("blast", "feeder")


def emit(**data: Any) -> None:
    print(json.dumps(data), flush=True)


def role_command(role: str, *args: object) -> list[str]:
    """The command line of a role: a client here, anything else in ``roles.py``."""
    script = "clients.py" if role in CLIENT_ROLES else "roles.py"
    return [sys.executable, str(HERE / script), role, *map(str, args)]


def blaster(port: int, rcpts: list[str], count: int, warmup: int) -> None:
    """Ingest: send ``count`` mails over one connection per rcpt, as fast as answered."""
    emit(**asyncio.run(blast("127.0.0.1", port, rcpts, count, warmup)))


def feeder(port: int) -> None:
    """Wake-up: for each ``rcpt<TAB>subject`` line on stdin send one mail on one reused
    connection, and print the monotonic times at which it was sent and its 250 arrived."""
    client = BlockingClient("127.0.0.1", port)
    for line in sys.stdin:
        rcpt, _, subject = line.rstrip("\n").partition("\t")
        sent, answered = client.send(rcpt, mail(rcpt, subject))
        print(f"{sent!r} {answered!r}", flush=True)
    client.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="clients.py")
    roles = parser.add_subparsers(dest="role", required=True)
    p = roles.add_parser("blast")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rcpts", required=True)
    p.add_argument("--count", type=int, required=True)
    p.add_argument("--warmup", type=int, default=20)
    p = roles.add_parser("feeder")
    p.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    if args.role == "blast":
        blaster(args.port, args.rcpts.split(","), args.count, args.warmup)
    else:
        feeder(args.port)


if __name__ == "__main__":
    main()
