"""A tiny sign-up app: it sends a real verification e-mail (a link and a 6-digit code) over SMTP."""

from __future__ import annotations

import secrets
import smtplib
from dataclasses import dataclass, field
from email.message import EmailMessage
from urllib.parse import parse_qs, urlparse


@dataclass
class SignupApp:
    """Users sign up, receive a mail, and verify with the link or the code."""

    smtp_host: str
    smtp_port: int
    base_url: str = "https://app.example.test"
    sender: str = "noreply@app.example.test"
    pending: dict[str, tuple[str, str]] = field(default_factory=dict)
    verified: set[str] = field(default_factory=set)

    def signup(self, email: str, *, run_id: str | None = None) -> None:
        """Create a pending account and send its verification mail."""
        token, code = secrets.token_urlsafe(24), f"{secrets.randbelow(10**6):06d}"
        self.pending[email] = (token, code)
        link = f"{self.base_url}/verify?token={token}"
        mail = EmailMessage()
        mail["From"] = f"Example App <{self.sender}>"
        mail["To"] = email
        mail["Subject"] = "Verify your e-mail address \N{WHITE HEAVY CHECK MARK}"
        if run_id is not None:
            mail["X-Run-Id"] = run_id
        # Like most real mail, a footer links elsewhere on the same host.
        unsubscribe = f"{self.base_url}/unsubscribe?list=news"
        mail.set_content(
            f"Welcome!\n\nOpen {link} or enter the code {code}.\n\nUnsubscribe: {unsubscribe}\n"
        )
        mail.add_alternative(
            f'<p>Welcome!</p><p><a href="{link}">Verify my address</a></p>'
            f"<p>Your code: <b>{code}</b></p>"
            f'<p><a href="{unsubscribe}">Unsubscribe</a></p>',
            subtype="html",
        )
        with smtplib.SMTP(self.smtp_host, self.smtp_port) as smtp:
            smtp.send_message(mail)

    def verify_link(self, link: str) -> bool:
        """Open the verification link: valid once, for the account it was sent to."""
        (token,) = parse_qs(urlparse(link).query)["token"]
        for email, (expected, _) in list(self.pending.items()):
            if secrets.compare_digest(token, expected):
                del self.pending[email]
                self.verified.add(email)
                return True
        return False

    def verify_code(self, email: str, code: str) -> bool:
        """Enter the 6-digit code instead of opening the link."""
        token_code = self.pending.get(email)
        if token_code is None or not secrets.compare_digest(code, token_code[1]):
            return False
        del self.pending[email]
        self.verified.add(email)
        return True
