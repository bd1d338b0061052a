"""The client's address: the connecting one, or what trusted proxies forwarded, never
what a client claims (config/addresses.py)."""

from __future__ import annotations

import ipaddress
from typing import Any

import pytest
from django.http import HttpRequest
from django.test import RequestFactory

from config.addresses import client_address
from tests.test_settings import load_settings

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
