"""The core without pytest: a script (or an agent harness) with its own sink and store.

Run as ``python without_pytest.py``: it sends one mail to a mailbox of its own over real
SMTP, claims and acknowledges it, and prints the receipt (tests/test_recipes.py runs it).
"""

from __future__ import annotations

import smtplib
from email.message import EmailMessage

from pytest_mailbox import EmailContract, Mailbox, MailSink, Store

with Store("mail.sqlite3") as store, MailSink(store, domains=["mailbox.test"]) as sink:
    box = Mailbox.reserve(store, contract=EmailContract(purpose="signup"), domain="mailbox.test")
    mail = EmailMessage()
    mail["From"], mail["To"], mail["Subject"] = "app@example.test", box.address, "Welcome"
    mail.set_content("Hello!")
    with smtplib.SMTP(sink.host, sink.port) as smtp:  # your app sends it
        smtp.send_message(mail)
    msg = box.wait_for(subject_contains="Welcome")
    msg.ack()
    print(box.close(success=True).model_dump_json())
