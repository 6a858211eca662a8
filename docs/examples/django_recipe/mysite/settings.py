"""Settings of the example site; its tests send mail to pytest-mailbox (see conftest.py)."""

from __future__ import annotations

import django

SECRET_KEY = "django-insecure-recipe-only"
DEBUG = False
ALLOWED_HOSTS = ["app.example.test"]
ROOT_URLCONF = "mysite.urls"
INSTALLED_APPS = ["accounts"]
DATABASES: dict[str, dict[str, str]] = {}
USE_TZ = True

#: Links in mail point at the public site, not at the host that served the request.
SITE_URL = "https://app.example.test"
DEFAULT_FROM_EMAIL = "Example <noreply@app.example.test>"
# Production's mail server; the tests point Django at the sink (conftest.py).
if django.VERSION >= (6, 1):  # MAILERS replaces the EMAIL_* settings
    MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
            "OPTIONS": {"host": "smtp.example.com"},
        }
    }
else:
    EMAIL_HOST = "smtp.example.com"
