"""Where an Apprise URL may post: the webhook destination rule (DESIGN §5), for every scheme.

Apprise turns a URL into an HTTP request to its service. Some schemes post to a fixed host of
that service (`discord://` → discord.com); others post to the host written in the URL
(`workflows://host:port/…`, and the generic `json://`), which would reach any host and port
inside the network if nothing checked it. So, for every channel kind alike:

1. at save (`apprise_refusal`): the host the URL posts to must be on
   `SAFESTOP_WEBHOOK_ALLOWED_HOSTS`; `verify=no` (TLS checks off) and `redirect=yes` are refused;
2. at send (`apprise_guarded`): checked again (the list may have shrunk), the plugin is pinned to
   verified TLS and no redirects, and every HTTP request Apprise makes during the send passes
   the allow-list before a connection is opened — a plugin that would contact another host
   (a redirect, a second API) is stopped there, and the delivery fails for good, saying why.

Apprise sends with `requests` and creates its own sessions, so the check sits on requests'
`HTTPAdapter.send`, active only in the thread that is inside `apprise_guarded` (Apprise is told
to notify sequentially, in the calling thread). Environment proxies are ignored, as for webhooks.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from runs.errors import InvalidInput
from runs.services import validate_outbox_destination

ALLOW_LIST = "SAFESTOP_WEBHOOK_ALLOWED_HOSTS"

# Schemes whose service has fixed hosts, by region where the service has regions. Any other
# scheme posts to the host written in its URL.
_FIXED_HOSTS: dict[str, dict[str, str]] = {
    "discord": {"": "discord.com"},
    "tgram": {"": "api.telegram.org"},
    "pover": {"": "api.pushover.net"},
    "pagerduty": {"": "events.pagerduty.com", "eu": "events.eu.pagerduty.com"},
    "opsgenie": {"": "api.opsgenie.com", "eu": "api.eu.opsgenie.com"},
}


def _asset() -> Any:
    import apprise

    # Sequential: the send runs in the calling thread, where the request guard is active.
    return apprise.AppriseAsset(async_mode=False, http_redirects=False)


def _plugin(target: str) -> Any:
    import apprise

    return apprise.Apprise.instantiate(target, asset=_asset())


def destination_host(scheme: str, plugin: Any) -> str:
    """`host` or `host:port` the plugin will post to."""
    fixed = _FIXED_HOSTS.get(scheme)
    if fixed is not None:
        region = str(getattr(plugin, "region_name", "") or "").lower()
        return fixed.get(region, fixed[""])
    host = str(getattr(plugin, "host", "") or "")
    port = getattr(plugin, "port", None)
    return f"{host}:{port}" if port else host


def _host_allowed(host: str) -> bool:
    try:
        validate_outbox_destination("webhook", f"https://{host}/")
    except InvalidInput:
        return False
    return True


def apprise_refusal(target: str, *, schemes: list[str]) -> str | None:
    """Why this Apprise URL may not be a channel's target, or None when it may."""
    scheme = target.split("://", 1)[0].lower() if "://" in target else ""
    if scheme not in schemes:
        listed = ", ".join(s + "://" for s in schemes)
        return f"an Apprise URL must start with one of {listed} (SAFESTOP_NOTIFY_APPRISE_SCHEMES)"
    plugin = _plugin(target)
    if plugin is None:
        return "Apprise does not understand this URL"
    if not getattr(plugin, "verify_certificate", True):
        return "TLS certificate checks cannot be turned off (verify=no)"
    if getattr(plugin, "redirects", False):
        return "redirects are never followed (redirect=yes)"
    host = destination_host(scheme, plugin)
    if not host or not _host_allowed(host):
        return f"this URL posts to {host or 'no host'}, which is not on {ALLOW_LIST}"
    return None


# --------------------------------------------------------------------------------------------
# the send-time guard


@dataclass
class _Guard:
    refused: list[str] = field(default_factory=list)  # hosts a request was refused for


_local = threading.local()
_install_lock = threading.Lock()
_installed = False


class RequestRefused(Exception):
    """Raised into Apprise when it tries to reach a host off the allow-list."""


def _install() -> None:
    """Wrap requests' `HTTPAdapter.send` once per process (a no-op outside a guarded send)."""
    global _installed
    with _install_lock:
        if _installed:
            return
        import requests
        from requests.adapters import HTTPAdapter

        original = HTTPAdapter.send

        def send(
            self: HTTPAdapter,
            request: Any,
            stream: bool = False,
            timeout: Any = None,
            verify: Any = True,
            cert: Any = None,
            proxies: Any = None,
        ) -> Any:
            guard: _Guard | None = getattr(_local, "guard", None)
            if guard is None:
                return original(self, request, stream, timeout, verify, cert, proxies)
            parts = urlsplit(str(request.url))
            host = f"{parts.hostname}:{parts.port}" if parts.port else str(parts.hostname or "")
            if not _host_allowed(host):
                guard.refused.append(host)
                # A ConnectionError is what Apprise expects from the network: it records the
                # failure and goes on; `apprise_guarded` turns it into a refusal.
                raise requests.exceptions.ConnectionError(f"{host} is not on {ALLOW_LIST}")
            # TLS is always verified (a CA bundle path stays), and no environment proxy is used.
            return original(
                self, request, stream, timeout, verify if verify is not False else True, cert, {}
            )

        HTTPAdapter.send = send  # type: ignore[method-assign]
        _installed = True


@dataclass
class GuardedSend:
    notifier: Any
    refused: list[str]


@contextmanager
def apprise_guarded(target: str) -> Iterator[GuardedSend | None]:
    """An Apprise notifier for `target`, pinned to verified TLS and no redirects, with every
    request it makes checked against the allow-list while the block runs. None when Apprise
    does not understand the URL."""
    import apprise

    _install()
    notifier = apprise.Apprise(asset=_asset())
    if not notifier.add(target):
        yield None
        return
    for plugin in notifier:
        plugin.verify_certificate = True
        plugin.redirects = False
    guard = _Guard()
    _local.guard = guard
    try:
        yield GuardedSend(notifier, guard.refused)
    finally:
        _local.guard = None
