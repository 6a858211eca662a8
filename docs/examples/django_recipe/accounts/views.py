"""Sign-up by e-mail: a verification mail with a signed link, and the view that link opens."""

from __future__ import annotations

from django.conf import settings
from django.core import signing
from django.core.mail import EmailMultiAlternatives
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

SALT = "accounts.verify"


@require_POST
def signup(request: HttpRequest) -> HttpResponse:
    """Send a verification mail (text and HTML) to the address given."""
    email = request.POST["email"]
    link = settings.SITE_URL + reverse("verify", args=[signing.dumps(email, salt=SALT)])
    mail = EmailMultiAlternatives(
        subject="Verify your address",
        body=f"Welcome!\n\nOpen {link} to verify your address.\n",
        to=[email],
    )
    mail.attach_alternative(f'<p>Welcome!</p><p><a href="{link}">Verify</a></p>', "text/html")
    mail.send()
    return HttpResponse(status=202)


@require_GET
def verify(request: HttpRequest, token: str) -> HttpResponse:
    """Open the link from the mail: it proves the address for an hour."""
    try:
        email = signing.loads(token, salt=SALT, max_age=3600)
    except signing.BadSignature:
        return HttpResponseBadRequest("invalid or expired link")
    return HttpResponse(f"verified {email}")
