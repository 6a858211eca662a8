"""``python -m pytest_mailbox receipts report.xml``."""

from __future__ import annotations

import os
import sys

from pytest_mailbox.receipts import main


def run() -> int:
    """``main``, stopped quietly when the reader of stdout stops reading (``| head``)."""
    try:
        status = main()
        sys.stdout.flush()  # here, where a closed pipe is caught, not at the exit
    except BrokenPipeError:
        # Python's documentation (signal, "Note on SIGPIPE"): stdout to /dev/null, so that
        # its flush at the exit fails no more, and status 1.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return 1
    return status


if __name__ == "__main__":
    sys.exit(run())
