"""Clients from other ecosystems deliver multipart mail that a test claims and parses whole.

nodemailer (Node.js) and swaks (Perl) build their MIME and speak SMTP their own way, so the
sink is shown not to depend on Python's smtplib. `make test` installs nodemailer into .node/
when node is present; `.ci/run` installs swaks (and Node.js) when they are missing.
"""

from __future__ import annotations

import base64
import email
import email.policy
import json
import os
import shutil
import subprocess
from email.message import EmailMessage
from pathlib import Path

import pytest

from pytest_mailbox import ClaimedMessage, Mailbox, MailSink

ROOT = Path(__file__).parents[1]
NODE_SCRIPT = ROOT / "tests" / "node" / "send_mail.js"
NODE_MODULES = ROOT / ".node" / "node_modules"

SUBJECT = "Vérifiez votre adresse \N{WHITE HEAVY CHECK MARK}"
SENDER = "noreply@app.example.test"
LINK = "https://app.example.test/verify?token=Nd7xQ2pLw9"
TEXT = f"Bonjour !\n\nOuvrez {LINK} pour confirmer votre adresse.\n"
HTML = f'<p>Bonjour !</p><p><a href="{LINK}">Vérifier mon adresse</a></p>'
ATTACHMENT = (
    "recu.pdf",
    "application/pdf",
    b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n\x00\x01\xfe\xff\n%%EOF\n",
)


def _require(program: str, how: str) -> str:
    """The program's path, or a failure that says how to install it (never a skip)."""
    path = shutil.which(program)
    if path is None:
        pytest.fail(f"{program} is not installed; {how}", pytrace=False)
    return path


def _run(args: list[str], env: dict[str, str] | None = None) -> str:
    """Run a client to completion; its output, or a failure that shows its transcript."""
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60, check=False)
    if proc.returncode != 0:
        pytest.fail(f"{args[0]} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _attachments(raw: bytes) -> list[tuple[str | None, str, bytes]]:
    """(filename, content type, decoded bytes) of every attachment, by the stdlib's parser."""
    parsed = email.message_from_bytes(raw, policy=email.policy.default)
    assert isinstance(parsed, EmailMessage)
    return [
        (part.get_filename(), part.get_content_type(), part.get_payload(decode=True))
        for part in parsed.walk()
        if part.is_attachment()
    ]


def assert_delivered_whole(msg: ClaimedMessage, mailbox: Mailbox) -> None:
    """Decoded subject, both bodies, the link, the sender and the attachment all arrived."""
    assert msg.subject == SUBJECT
    assert SUBJECT.encode() not in msg.raw  # it travelled RFC 2047-encoded
    assert msg.text.replace("\r\n", "\n").strip() == TEXT.strip()
    assert msg.html.strip() == HTML
    assert msg.link(domain="app.example.test") == LINK
    assert msg.sender == SENDER
    assert msg.envelope_to == mailbox.address
    assert _attachments(msg.raw) == [ATTACHMENT]


@pytest.mark.parametrize("login", [None, "PLAIN", "LOGIN"], ids=["no-login", "plain", "login"])
def test_nodemailer_multipart_mail_is_claimed(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, login: str | None
) -> None:
    """Also logged in, with either mechanism: nodemailer takes any ``334`` challenge, and
    an app's transport keeps its relay's ``auth``."""
    node = _require(
        "node",
        "install Node.js (apt-get install nodejs; .ci/run does it), then `make node-deps`",
    )
    if not (NODE_MODULES / "nodemailer").is_dir():
        pytest.fail(
            f"nodemailer is not installed in {NODE_MODULES.parent}; run `make node-deps` "
            "(make test runs it when node is present)",
            pytrace=False,
        )
    filename, content_type, content = ATTACHMENT
    spec = {
        "host": mailbox_server.host,
        "port": mailbox_server.port,
        "from": f"Exemple <{SENDER}>",
        "to": isolated_mailbox.address,
        "subject": SUBJECT,
        "text": TEXT,
        "html": HTML,
        "attachment": {
            "filename": filename,
            "contentType": content_type,
            "base64": base64.b64encode(content).decode(),
        },
    }
    if login is not None:
        spec.update(auth={"user": "apikey", "pass": "SG.pw-Zq8vT4nW2xKp9LmR"}, authMethod=login)
    isolated_mailbox.checkpoint()

    sent = _run(
        [node, str(NODE_SCRIPT), json.dumps(spec)],
        env={**os.environ, "NODE_PATH": str(NODE_MODULES)},
    )

    assert json.loads(sent) == {
        "accepted": [isolated_mailbox.address],
        "rejected": [],
        "loggedIn": login is not None,
    }
    msg = isolated_mailbox.wait_for(subject=SUBJECT, timeout=10)
    assert_delivered_whole(msg, isolated_mailbox)
    msg.ack()


def test_swaks_multipart_mail_is_claimed(
    mailbox_server: MailSink, isolated_mailbox: Mailbox, tmp_path: Path
) -> None:
    swaks = _require("swaks", "apt-get install swaks (.ci/run installs it when run as root)")
    filename, content_type, content = ATTACHMENT
    (tmp_path / filename).write_bytes(content)
    encoded_subject = f"=?UTF-8?B?{base64.b64encode(SUBJECT.encode()).decode()}?="
    isolated_mailbox.checkpoint()

    options = [
        ("--server", f"{mailbox_server.host}:{mailbox_server.port}"),
        ("--from", SENDER),
        ("--to", isolated_mailbox.address),
        ("--h-From", f"Exemple <{SENDER}>"),
        ("--h-Subject", encoded_subject),
        ("--attach-type", "text/plain; charset=UTF-8"),  # --attach-body parts make
        ("--attach-body", TEXT),  # a multipart/alternative body
        ("--attach-type", "text/html; charset=UTF-8"),
        ("--attach-body", HTML),
        ("--attach-type", content_type),
        ("--attach-name", filename),
        ("--attach", f"@{tmp_path / filename}"),  # @: the file's content
    ]
    _run([swaks, *(word for option in options for word in option)])

    msg = isolated_mailbox.wait_for(subject=SUBJECT, timeout=10)
    assert (msg.header("X-Mailer") or "").startswith("swaks")
    assert_delivered_whole(msg, isolated_mailbox)
    msg.ack()
