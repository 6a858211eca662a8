"""A FastAPI app that sends its verification mail with fastapi-mail, async (docs/recipes.md)."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException
from fastapi_mail import (
    ConnectionConfig,
    FastMail,
    MessageSchema,
    MessageType,
    MultipartSubtypeEnum,
)
from pydantic import BaseModel

SITE_URL = "https://app.example.test"

app = FastAPI()
pending: dict[str, str] = {}  # token -> address; a database in a real app


class Signup(BaseModel):
    email: str


def mail_config() -> ConnectionConfig:
    """Production settings come from MAIL_* environment variables; tests override this."""
    return ConnectionConfig()


@app.post("/signup", status_code=202)
async def signup(
    body: Signup, config: Annotated[ConnectionConfig, Depends(mail_config)]
) -> dict[str, str]:
    token = secrets.token_urlsafe(16)
    pending[token] = body.email
    link = f"{SITE_URL}/verify/{token}"
    message = MessageSchema(
        subject="Verify your address",
        recipients=[body.email],
        body=f'<p>Welcome!</p><p><a href="{link}">Verify</a></p>',
        alternative_body=f"Welcome!\n\nOpen {link} to verify your address.\n",
        subtype=MessageType.html,
        multipart_subtype=MultipartSubtypeEnum.alternative,
    )
    await FastMail(config).send_message(message)  # aiosmtplib, on the app's event loop
    return {"status": "sent"}


@app.get("/verify/{token}")
async def verify(token: str) -> dict[str, str]:
    email = pending.pop(token, None)
    if email is None:
        raise HTTPException(status_code=400, detail="invalid or used link")
    return {"verified": email}
