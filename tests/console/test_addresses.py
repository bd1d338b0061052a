"""The client's address: the connecting one, or what trusted proxies forwarded, never
what a client claims (tasks_app/addresses.py)."""

from __future__ import annotations

import contextlib
import http.client
import ipaddress
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.http import HttpRequest, HttpResponse
from django.test import RequestFactory
from honcho.environ import parse_procfile

from tasks_app.addresses import ForwardedProtoMiddleware, client_address
from tests.e2e_support import ROOT, spare_port, wait_for
from tests.settings_support import PRODUCTION, clean_env, load_settings

PROXY = "10.9.0.5"
TRUSTED = [ipaddress.ip_network("10.9.0.0/16")]


def address_of(remote: str, forwarded: str | None = None) -> str | None:
    headers = {"X-Forwarded-For": forwarded} if forwarded is not None else {}
    return client_address(RequestFactory(REMOTE_ADDR=remote, headers=headers).get("/"))


def test_forwarded_for_is_ignored_with_no_trusted_proxy() -> None:
    assert address_of("198.51.100.7", "203.0.113.9") == "198.51.100.7"
    assert address_of(PROXY, "203.0.113.9") == PROXY


@pytest.mark.parametrize(
    ("remote", "forwarded", "client"),
    [
        (PROXY, "198.51.100.7", "198.51.100.7"),
        # What a client sent is left of what the proxy appended, and is not believed.
        (PROXY, "203.0.113.9, 198.51.100.7", "198.51.100.7"),
        # Two trusted proxies in a row.
        (PROXY, "203.0.113.9, 198.51.100.7, 10.9.0.6", "198.51.100.7"),
        # A client the proxy did not forward for keeps its own address.
        ("198.51.100.7", "203.0.113.9", "198.51.100.7"),
        # No header, or one that is not an address: the proxy's.
        (PROXY, None, PROXY),
        (PROXY, "unknown", PROXY),
        (PROXY, "198.51.100.7, bogus", PROXY),
        (PROXY, " 2001:db8::1 ", "2001:db8::1"),
    ],
)
def test_forwarded_for_is_believed_only_as_far_as_trusted_proxies_wrote_it(
    settings: Any, remote: str, forwarded: str | None, client: str
) -> None:
    settings.TRUSTED_PROXY_NETWORKS = TRUSTED
    assert address_of(remote, forwarded) == client


def test_a_request_made_in_code_has_no_address() -> None:
    assert client_address(HttpRequest()) is None


def test_a_bad_trusted_proxy_setting_refuses_to_start() -> None:
    result = load_settings(DJANGO_TRUSTED_PROXIES="10.9.0.0/16,the-proxy")
    assert result.returncode != 0
    assert "DJANGO_TRUSTED_PROXIES must be comma-separated networks" in result.stderr


# --- whether a request came over TLS --------------------------------------------------------

HTTPS = ("HTTP_X_FORWARDED_PROTO", "https")


def scheme_seen(remote: str, proto: str | None) -> str:
    """The scheme Django sees for a request from ``remote`` carrying ``X-Forwarded-Proto:
    proto``, past the middleware."""
    headers = {"X-Forwarded-Proto": proto} if proto is not None else {}
    request = RequestFactory(REMOTE_ADDR=remote, headers=headers).get("/")
    response = ForwardedProtoMiddleware(lambda request: HttpResponse(request.scheme))(request)
    return response.content.decode()


@pytest.mark.parametrize(
    ("remote", "proto", "scheme"),
    [
        # A client writing the header itself, by the web process's own address.
        ("198.51.100.7", "https", "http"),
        ("127.0.0.1", "https", "http"),
        # The proxy's word counts, either way.
        (PROXY, "https", "https"),
        (PROXY, "http", "http"),
        (PROXY, None, "http"),
    ],
)
def test_forwarded_proto_is_believed_only_from_a_trusted_proxy(
    settings: Any, remote: str, proto: str | None, scheme: str
) -> None:
    settings.SECURE_PROXY_SSL_HEADER = HTTPS
    settings.TRUSTED_PROXY_NETWORKS = TRUSTED
    assert scheme_seen(remote, proto) == scheme


def test_with_no_trusted_proxy_no_request_is_https_on_a_headers_word(
    settings: Any, caplog: pytest.LogCaptureFixture
) -> None:
    settings.SECURE_PROXY_SSL_HEADER = HTTPS
    settings.TRUSTED_PROXY_NETWORKS = []
    middleware = ForwardedProtoMiddleware(lambda request: HttpResponse(request.scheme))
    seen = [
        middleware(
            RequestFactory(REMOTE_ADDR=remote, headers={"X-Forwarded-Proto": "https"}).get("/")
        ).content
        for remote in (PROXY, "198.51.100.7")
    ]
    assert seen == [b"http", b"http"]
    # Once per process, naming the address to trust if it is the proxy.
    assert [r.getMessage() for r in caplog.records if r.name == "tasks_app.addresses"] == [
        f"ignored X-Forwarded-Proto from {PROXY}, which is not a trusted proxy "
        "(DJANGO_TRUSTED_PROXIES); further ones are ignored without a line"
    ]


# --- the Procfile's web process -------------------------------------------------------------


@contextlib.contextmanager
def procfile_web(folder: Path, **env: str) -> Iterator[tuple[int, Path]]:
    """The Procfile's web line, as a Procfile runner starts it, in production mode on a
    free port (one gunicorn worker); yields the port and its log once it answers."""
    port = spare_port()
    log_path = folder / "web.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            ["sh", "-c", parse_procfile((ROOT / "Procfile").read_text()).processes["web"]],
            cwd=ROOT,
            env=clean_env(
                **{key: value for key, value in PRODUCTION.items() if key != "DJANGO_PRODUCTION"},
                **env,
                PORT=str(port),
                WEB_CONCURRENCY="1",
                PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:

        def answers() -> bool:
            if process.poll() is not None:
                raise AssertionError("the web process exited\n" + log_path.read_text())
            try:
                return get(port, "/healthz")[0] == 200
            except OSError:
                return False

        wait_for(answers, timeout=60, what=lambda: "the web process\n" + log_path.read_text())
        yield port, log_path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()


def get(port: int, path: str, **headers: str) -> tuple[int, str]:
    """GET ``path`` from the web process by loopback; its status and Location."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", path, headers={"Host": "example.com", **headers})
        response = connection.getresponse()
        return response.status, response.getheader("Location") or ""
    finally:
        connection.close()


@pytest.mark.e2e
@pytest.mark.timeout(120)
def test_the_web_process_takes_no_forged_https_and_believes_a_named_proxy(
    tmp_path: Path,
) -> None:
    """gunicorn binds every address; a client that reaches it directly and writes
    ``X-Forwarded-Proto: https`` is still plain HTTP (redirected to HTTPS), while the same
    request from a proxy named in DJANGO_TRUSTED_PROXIES is the HTTPS it forwarded."""
    forged = {"X-Forwarded-Proto": "https"}
    with procfile_web(tmp_path) as (port, log_path):
        assert get(port, "/", **forged) == (301, "https://example.com/")
        assert get(port, "/") == (301, "https://example.com/")
    assert "ignored X-Forwarded-Proto from 127.0.0.1" in log_path.read_text()

    (tmp_path / "trusted").mkdir()
    with procfile_web(tmp_path / "trusted", DJANGO_TRUSTED_PROXIES="127.0.0.1/32") as (port, _):
        assert get(port, "/", **forged) == (302, "/accounts/login/?next=/")
        assert get(port, "/") == (301, "https://example.com/")
