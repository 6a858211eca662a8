"""``python -m pytest_mailbox receipts report.xml``."""

from __future__ import annotations

import sys

from pytest_mailbox.receipts import main

if __name__ == "__main__":
    sys.exit(main())
