"""The address a request comes from, and whether it came over TLS, as far as the
deployment lets us know them.

The connecting address (``REMOTE_ADDR``) is the client's unless it is one of the proxies
named in ``TRUSTED_PROXY_NETWORKS`` (``DJANGO_TRUSTED_PROXIES``; none by default). Only
then is ``X-Forwarded-For`` read, and only as far as trusted proxies wrote it: anyone can
send the header, so believing it from anyone would let a client pick its own address.
The same proxies alone may say that a request came over TLS (``X-Forwarded-Proto``,
production's ``SECURE_PROXY_SSL_HEADER``): from anyone else the header is dropped.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse

logger = logging.getLogger(__name__)

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


def _parsed(value: str) -> Address | None:
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        return None


def _trusted(address: Address) -> bool:
    return any(address in network for network in settings.TRUSTED_PROXY_NETWORKS)


def client_address(request: HttpRequest) -> str | None:
    """The client's address, or None for a request without one (made in code).

    1. Start from the connecting address; if it is not a trusted proxy, it is the client.
    2. Otherwise walk ``X-Forwarded-For`` from the right: each entry was appended by the
       hop to its right, so it is believed while that hop is a trusted proxy.
    3. The first entry that is not a trusted proxy is the client. An entry that is not an
       address stops the walk at the last one believed; so does the header's left end.
    """
    client = _parsed(request.META.get("REMOTE_ADDR") or "")
    if client is None:
        return None
    forwarded = request.META.get("HTTP_X_FORWARDED_FOR", "")
    hops = [hop for hop in forwarded.split(",") if hop.strip()]
    while _trusted(client) and hops:
        hop = _parsed(hops.pop())
        if hop is None:
            break
        client = hop
    return str(client)


def from_trusted_proxy(request: HttpRequest) -> bool:
    """Whether the request's connecting address is one of the trusted proxies."""
    address = _parsed(request.META.get("REMOTE_ADDR") or "")
    return address is not None and _trusted(address)


class ForwardedProtoMiddleware:
    """Drops the header that says a request came over TLS (``SECURE_PROXY_SSL_HEADER``,
    set in production) unless a trusted proxy sent the request: a client reaching a web
    process directly, by its own address, cannot have a plain-HTTP request taken for HTTPS
    (secure cookies sent back, no redirect, HSTS) by writing the header itself.

    The first one dropped is logged, once per process: behind a proxy not named in
    ``DJANGO_TRUSTED_PROXIES`` every request it forwards is plain HTTP to Django and is
    redirected to HTTPS again, and the line names the address to add.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response
        self._warned = threading.Event()

    def __call__(self, request: HttpRequest) -> HttpResponse:
        header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
        if header and header[0] in request.META and not from_trusted_proxy(request):
            del request.META[header[0]]
            if not self._warned.is_set():
                self._warned.set()
                logger.warning(
                    "ignored X-Forwarded-Proto from %s, which is not a trusted proxy "
                    "(DJANGO_TRUSTED_PROXIES); further ones are ignored without a line",
                    request.META.get("REMOTE_ADDR") or "an unknown address",
                )
        return self.get_response(request)
