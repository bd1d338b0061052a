"""The address a request comes from, as far as the deployment lets us know it.

The connecting address (``REMOTE_ADDR``) is the client's unless it is one of the proxies
named in ``TRUSTED_PROXY_NETWORKS`` (``DJANGO_TRUSTED_PROXIES``; none by default). Only
then is ``X-Forwarded-For`` read, and only as far as trusted proxies wrote it: anyone can
send the header, so believing it from anyone would let a client pick its own address.
"""

from __future__ import annotations

import ipaddress

from django.conf import settings
from django.http import HttpRequest

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
