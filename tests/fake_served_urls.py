"""The project's URLs with the fake remotes served, as the embedded demo serves them."""

from __future__ import annotations

from django.urls import URLPattern, URLResolver, include, path

from config.urls import urlpatterns as project_urlpatterns

urlpatterns: list[URLPattern | URLResolver] = [
    *[pattern for pattern in project_urlpatterns if str(pattern.pattern) != "fake/"],
    path("fake/", include("tasks_app.demo.fake_urls")),
]
