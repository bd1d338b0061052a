"""The fake remotes under ``/fake/``; ``config/urls.py`` includes them only when
``TASKS_FAKE_REMOTES`` is on."""

from __future__ import annotations

from django.urls import path

from tasks_app.demo import fakes

app_name = "fakes"

urlpatterns = [
    path("publish/", fakes.publish_endpoint, name="publish"),
    path("mail/", fakes.mail_endpoint, name="mail"),
]
