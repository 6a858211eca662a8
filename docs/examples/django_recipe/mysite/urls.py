from __future__ import annotations

from accounts import views
from django.urls import path

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("verify/<str:token>/", views.verify, name="verify"),
]
