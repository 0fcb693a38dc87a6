"""Signed chain heads kept outside the database, so a chain cut short is found.

The keyed hash (runs/ledger.py) makes a changed entry show; it cannot show an entry that is no
longer there at the end of a chain, nor a chain deleted whole. So every clean walk of the whole
ledger writes an *anchor*: the heads (run, seq, hash, entry id) of the chains that grew since the
anchors before it, signed with the ledger key, one file in `SAFESTOP_LEDGER_ANCHOR_DIR`. Every
walk reads them all first and requires each anchored head to be still there, with the same hash:
what was removed from the end of a chain after an anchor recorded it is found. What was written
after the last anchor is not covered (the anchor interval bounds that).

The directory is one database's: a fresh database needs a fresh directory. It must be on storage
the database's writers cannot change (another host's mount, an object store with object lock);
anchors are never rewritten or deleted by safestop.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from django.conf import settings
from django.utils import timezone

from runs.ledger_keys import key_by_id, signing_key

KIND = "safestop.ledger.anchor"
FORMAT = 1
PATTERN = "anchor-*.json"


@dataclass(frozen=True)
class AnchorHead:
    """A chain's last entry as a walk found it (run_id None: the chain of entries without a run)."""

    run_id: str | None
    run_seq: int
    hash: str
    entry_id: int


@dataclass(frozen=True)
class Pin:
    """The furthest head any anchor recorded for one chain, and which anchor recorded it."""

    run_seq: int
    hash: str
    entry_id: int
    anchor: str
    written_at: str


@dataclass
class Anchors:
    """Every anchor read: per chain its furthest pin; `problem` when a file cannot be trusted."""

    pins: dict[str | None, Pin] = field(default_factory=dict)
    files: int = 0
    problem: str = ""


def anchor_dir() -> Path | None:
    configured = settings.SAFESTOP_LEDGER_ANCHOR_DIR
    return Path(configured) if configured else None


def _canonical(body: dict[str, Any]) -> bytes:
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def anchors_load() -> Anchors:
    """Read and check every anchor; the pins of those that verify. A file that does not parse,
    names no configured key or whose signature does not match is the `problem`: someone wrote
    there, and its pins are not used."""
    anchors = Anchors()
    directory = anchor_dir()
    if directory is None or not directory.is_dir():
        return anchors
    for path in sorted(directory.glob(PATTERN)):
        problem = _load_one(path, anchors.pins)
        if problem:
            anchors.problem = f"anchor {path.name}: {problem}"
            return anchors
        anchors.files += 1
    return anchors


def _load_one(path: Path, pins: dict[str | None, Pin]) -> str:
    try:
        body = json.loads(path.read_bytes())
        signature = body.pop("signature")
        key_id = body["key_id"]
        written_at = body["written_at"]
        heads = body["heads"]
        if body.get("kind") != KIND or body.get("format") != FORMAT:
            return "not a ledger anchor of a known format"
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as failure:
        return f"cannot be read ({type(failure).__name__})"
    key = key_by_id(key_id)
    if key is None:
        return f"signed with key {key_id!r}, which SAFESTOP_LEDGER_KEY does not list"
    if not isinstance(signature, str) or not hmac.compare_digest(
        key.sign(_canonical(body)), signature
    ):
        return "its signature does not match (the file was changed or forged)"
    for run_id, run_seq, digest, entry_id in heads:
        pinned = pins.get(run_id)
        if pinned is None or run_seq > pinned.run_seq:
            pins[run_id] = Pin(run_seq, digest, entry_id, path.name, written_at)
    return ""


def anchor_write(heads: list[AnchorHead], *, checked: int) -> str:
    """Write one signed anchor of `heads`; its file name. The file appears whole or not at all
    (written aside, flushed to disk, then renamed into place)."""
    directory = anchor_dir()
    if directory is None:
        raise RuntimeError("SAFESTOP_LEDGER_ANCHOR_DIR is empty: anchors are off")
    directory.mkdir(parents=True, exist_ok=True)
    now = timezone.now()
    key = signing_key()
    body: dict[str, Any] = {
        "kind": KIND,
        "format": FORMAT,
        "written_at": now.isoformat(timespec="microseconds"),
        "key_id": key.id,
        "entries_checked": checked,
        "heads": [[head.run_id, head.run_seq, head.hash, head.entry_id] for head in heads],
    }
    body["signature"] = key.sign(_canonical(body))
    # The time first, so names sort in the order written; a random tail, so two walks finishing
    # in the same microsecond do not overwrite each other.
    name = f"anchor-{now.strftime('%Y%m%dT%H%M%S%fZ')}-{secrets.token_hex(4)}.json"
    aside = directory / f".{name}.tmp"
    with open(aside, "wb") as handle:
        handle.write(json.dumps(body, separators=(",", ":")).encode())
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(aside, directory / name)
    return name
