"""The ledger's keys: an HMAC key the database never holds, so someone who can write the database
can change an entry but cannot make its hash agree again.

`SAFESTOP_LEDGER_KEY` (console/settings.py) is one or more `id:secret`, separated by whitespace
or commas. The first signs new entries and anchors; every one of them verifies. Each entry and
each anchor records the id of the key that signed it, so a key is rotated by putting a new one
first and keeping the old one after it for as long as entries or anchors signed with it exist
(for ever, in practice: the ledger is append-only). A bare secret without an id gets one made
from its fingerprint.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

_KEY_ID = re.compile(r"^[A-Za-z0-9_.-]{1,32}$")
_SEPARATORS = re.compile(r"[\s,]+")


@dataclass(frozen=True)
class LedgerKey:
    id: str
    secret: bytes = b""
    # The HMAC state after the key, made once: copying it costs half of starting anew (an
    # append signs one entry, a walk a million).
    _keyed: Any = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_keyed", hmac.new(self.secret, digestmod=hashlib.sha256))

    def sign(self, message: bytes) -> str:
        signer = self._keyed.copy()
        signer.update(message)
        return str(signer.hexdigest())

    def __repr__(self) -> str:  # never the secret, in a log or a traceback
        return f"LedgerKey({self.id!r})"


@dataclass(frozen=True)
class LedgerKeys:
    signing: LedgerKey
    by_id: Mapping[str, LedgerKey]


def ledger_keys() -> LedgerKeys:
    """The configured keys, parsed once per distinct setting value (tests override it)."""
    return _parse(settings.SAFESTOP_LEDGER_KEY)


def signing_key() -> LedgerKey:
    return ledger_keys().signing


def key_by_id(key_id: str) -> LedgerKey | None:
    return ledger_keys().by_id.get(key_id)


@functools.lru_cache(maxsize=8)
def _parse(text: str) -> LedgerKeys:
    keys: list[LedgerKey] = []
    for item in _SEPARATORS.split(text.strip()):
        if not item:
            continue
        key_id, colon, secret = item.partition(":")
        if not colon:
            key_id, secret = "k" + hashlib.sha256(item.encode()).hexdigest()[:12], item
        if not _KEY_ID.match(key_id):
            raise ImproperlyConfigured(
                f"SAFESTOP_LEDGER_KEY: key id {key_id!r} must be 1-32 letters, digits, '_', '.' or '-'"
            )
        if len(secret) < 16:
            raise ImproperlyConfigured(
                f"SAFESTOP_LEDGER_KEY: the secret of key {key_id!r} is shorter than 16 characters"
            )
        if any(key.id == key_id for key in keys):
            raise ImproperlyConfigured(f"SAFESTOP_LEDGER_KEY: key id {key_id!r} appears twice")
        keys.append(LedgerKey(key_id, secret.encode()))
    if not keys:
        raise ImproperlyConfigured("SAFESTOP_LEDGER_KEY is empty: the ledger needs a key")
    return LedgerKeys(signing=keys[0], by_id={key.id: key for key in keys})
