"""The API's app: its URLs and schema live in ``api.main``."""

from __future__ import annotations

from django.apps import AppConfig


class ApiConfig(AppConfig):
    """The console for programs: a JSON API at /api/v1/ (api.main), read by token."""

    name = "api"
    default_auto_field = "django.db.models.BigAutoField"
