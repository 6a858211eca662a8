"""docs/recipes.md, any program: a subprocess finds the sink through SMTP_HOST and SMTP_PORT."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pytest_mailbox import Mailbox, MailSink

APP = Path(__file__).with_name("send_code.py")


def test_a_subprocess_reads_the_sink_address_from_its_environment(
    mailbox_server: MailSink, isolated_mailbox: Mailbox
) -> None:
    isolated_mailbox.checkpoint()
    sent = subprocess.run(
        [sys.executable, APP, isolated_mailbox.address],
        env={**os.environ, **mailbox_server.settings["env"]},  # this child only
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )

    msg = isolated_mailbox.wait_for(subject="Your sign-in code", timeout=10)
    assert msg.code() == sent.stdout.strip()
    msg.ack()
