"""A tiny app run as a subprocess: it mails a sign-in code to the address it is given.

It reads where to send from its environment, as twelve-factor apps do::

    SMTP_HOST=127.0.0.1 SMTP_PORT=2525 python send_code.py someone@example.test

and prints the code it sent, so its caller can check what arrived (docs/recipes.md).
"""

from __future__ import annotations

import os
import secrets
import smtplib
import sys
from email.message import EmailMessage


def main(to: str) -> str:
    code = f"{secrets.randbelow(10**6):06d}"
    mail = EmailMessage()
    mail["From"] = "Example <noreply@app.example.test>"
    mail["To"] = to
    mail["Subject"] = "Your sign-in code"
    mail.set_content(f"Your code is {code}. It expires in 10 minutes.\n")
    with smtplib.SMTP(os.environ["SMTP_HOST"], int(os.environ["SMTP_PORT"])) as smtp:
        smtp.send_message(mail)
    return code


if __name__ == "__main__":
    sys.stdout.write(main(sys.argv[1]) + "\n")
