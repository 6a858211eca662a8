"""A Flask app that sends its verification mail with Flask-Mail (docs/recipes.md)."""

from __future__ import annotations

from typing import Any

from flask import Flask, request
from flask_mail import Mail, Message
from itsdangerous import BadSignature, URLSafeTimedSerializer

mail = Mail()


def create_app(config: dict[str, Any] | None = None) -> Flask:
    """The app factory: ``config`` (a test's settings) overrides the defaults."""
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="dev-only",
        SITE_URL="https://app.example.test",
        MAIL_SERVER="smtp.example.com",
        MAIL_USERNAME="apikey",  # production's relay wants a login
        MAIL_PASSWORD="not-a-real-password",
        MAIL_DEFAULT_SENDER="Example <noreply@app.example.test>",
    )
    app.config.update(config or {})
    mail.init_app(app)  # Flask-Mail reads MAIL_* here: configure before this line
    tokens = URLSafeTimedSerializer(app.config["SECRET_KEY"], salt="verify")

    @app.post("/signup")
    def signup() -> tuple[str, int]:
        email = request.form["email"]
        link = f"{app.config['SITE_URL']}/verify/{tokens.dumps(email)}"
        mail.send(
            Message(
                "Verify your address",
                recipients=[email],
                body=f"Welcome!\n\nOpen {link} to verify your address.\n",
                html=f'<p>Welcome!</p><p><a href="{link}">Verify</a></p>',
            )
        )
        return "", 202

    @app.get("/verify/<token>")
    def verify(token: str) -> tuple[str, int]:
        try:
            email = tokens.loads(token, max_age=3600)
        except BadSignature:
            return "invalid or expired link", 400
        return f"verified {email}", 200

    return app
