"""Whether an address a server binds is reachable from other machines.

A server bound to loopback (127.0.0.0/8, ::1, localhost) answers this machine only; any other
address (0.0.0.0 binds every interface, a host name resolves to one) is exposed, and `make
serve`'s server then requires an API key (sglang.serve_api_key_env).
"""

from __future__ import annotations

import ipaddress

__all__ = ["is_loopback"]


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) binds loopback only."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: whatever it resolves to, not known to be loopback
