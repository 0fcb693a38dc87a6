"""The tamper-evident ledger: an append-only, per-run hash chain.

`ledger_append` is called by every transition inside its transaction, after the run row is
locked, so the per-run chain is written by one transaction at a time. Entries without a run
(token creation, …) form their own chain; a unique constraint on their sequence refuses a fork
and the append is retried.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import hooks, sql
from runs.actors import Actor
from runs.models import LedgerEntry, Run

GENESIS_HASH = "0" * 64


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True))


def entry_hash(
    *,
    run_id: str | None,
    run_seq: int,
    at: str,
    actor_kind: str,
    actor_id: str,
    actor: str,
    action: str,
    reason: str,
    payload: Any,
    prev_hash: str,
) -> str:
    body = json.dumps(
        {
            "run_id": run_id,
            "run_seq": run_seq,
            "at": at,
            "actor_kind": actor_kind,
            "actor_id": actor_id,
            "actor": actor,
            "action": action,
            "reason": reason,
            "payload": payload,
            "prev_hash": prev_hash,
        },
        sort_keys=True,
        separators=(",", ":"),
        cls=DjangoJSONEncoder,
    )
    return hashlib.sha256(body.encode()).hexdigest()


def _timestamp(at: Any) -> str:
    return at.isoformat(timespec="microseconds")


@dataclass(frozen=True)
class ChainHead:
    """A run chain's last entry, as read under the run lock: `run_seq` 0 and the genesis hash
    for an empty chain."""

    run_seq: int
    hash: str


EMPTY_CHAIN = ChainHead(0, GENESIS_HASH)


def ledger_append(
    *,
    run: Run | None,
    actor: Actor,
    action: str,
    reason: str = "",
    payload: dict[str, Any] | None = None,
    team_slug: str = "",
    head: ChainHead | None = None,
) -> LedgerEntry:
    """Append one entry. Call it inside the transition's transaction, after locking the run.

    `head`: the run chain's head when the caller has just read it under the same lock (the
    stop reads it in its one statement), which saves reading it again.
    """
    payload = _canonical(payload or {})
    if run is not None:
        # The caller holds the run row lock, which serialises this run's chain: a fork is
        # impossible, so no savepoint and no retry (two statements saved on every transition).
        return _insert_entry(
            run=run,
            actor=actor,
            action=action,
            reason=reason,
            payload=payload,
            team_slug=team_slug or run.team.slug,
            head=head,
        )
    for _attempt in range(5):
        try:
            with transaction.atomic():
                return _insert_entry(
                    run=run,
                    actor=actor,
                    action=action,
                    reason=reason,
                    payload=payload,
                    team_slug=team_slug,
                )
        except IntegrityError:
            continue  # another writer took this global seq first: read the new head and retry
    raise RuntimeError("could not append to the global ledger chain")


def chain_head(run: Run | None) -> ChainHead:
    last = LedgerEntry.objects.filter(run=run).order_by("-run_seq").only("run_seq", "hash").first()
    return ChainHead(last.run_seq, last.hash) if last else EMPTY_CHAIN


def _insert_entry(
    *,
    run: Run | None,
    actor: Actor,
    action: str,
    reason: str,
    payload: Any,
    team_slug: str,
    head: ChainHead | None = None,
) -> LedgerEntry:
    head = head or chain_head(run)
    run_seq = head.run_seq + 1
    prev_hash = head.hash
    # Truncate to microseconds as stored, so the verifier recomputes the very same string.
    at = timezone.now()
    digest = entry_hash(
        run_id=run.pk if run else None,
        run_seq=run_seq,
        at=_timestamp(at),
        actor_kind=actor.kind,
        actor_id=actor.id,
        actor=actor.name,
        action=action,
        reason=reason,
        payload=payload,
        prev_hash=prev_hash,
    )
    entry = LedgerEntry(
        run=run,
        run_seq=run_seq,
        at=at,
        actor_kind=actor.kind,
        actor_id=actor.id,
        actor=actor.name,
        team_slug=team_slug,
        action=action,
        reason=reason,
        payload=payload,
        prev_hash=prev_hash,
        hash=digest,
    )
    # Every transition appends: its INSERT is built once, not compiled by the ORM each time.
    if sql.prepared_statements():
        sql.insert(entry)
    else:
        entry.save(force_insert=True)
    # Same transaction as the entry: what listeners write (notification rows) commits with it.
    hooks.entry_appended(entry, run)
    return entry


@dataclass(frozen=True)
class ChainBreak:
    entry_id: int
    run_id: str | None
    run_seq: int
    problem: str


@dataclass(frozen=True)
class VerifyProgress:
    """Where a verification is: reported every `progress_every` entries and once at the end."""

    checked: int
    seconds: float
    done: bool = False

    @property
    def rate(self) -> float:
        """Entries per second so far."""
        return self.checked / self.seconds if self.seconds > 0 else 0.0


# What `_entry_problem` needs of a row, in this order: read as tuples, never as model
# instances (a million `LedgerEntry` objects cost time, and the walk keeps none of them).
_VERIFIED_COLUMNS = (
    "pk",
    "run_id",
    "run_seq",
    "at",
    "actor_kind",
    "actor_id",
    "actor",
    "action",
    "reason",
    "payload",
    "prev_hash",
    "hash",
)
VERIFY_CHUNK = 2000
VERIFY_PROGRESS_EVERY = 100_000


class _Row(NamedTuple):
    pk: int
    run_id: str | None
    run_seq: int
    at: Any
    actor_kind: str
    actor_id: str
    actor: str
    action: str
    reason: str
    payload: Any
    prev_hash: str
    hash: str


def ledger_verify(
    *,
    run_id: str | None = None,
    progress: Callable[[VerifyProgress], None] | None = None,
    progress_every: int = VERIFY_PROGRESS_EVERY,
    chunk_size: int = VERIFY_CHUNK,
) -> tuple[int, ChainBreak | None]:
    """Walk every chain (or one run's); return (entries checked, first break or None).

    Memory stays bounded whatever the ledger's size: rows stream in `chunk_size` batches and
    only the previous entry's hash is kept. `progress` is called every `progress_every`
    entries and once at the end, for a command's output or a task's log.
    """
    entries = LedgerEntry.objects.order_by("run_id", "run_seq")
    if run_id is not None:
        entries = entries.filter(run_id=run_id)
    started = time.monotonic()
    # Inside a transaction, PostgreSQL's server-side cursor streams from the (run, run_seq)
    # index; in autocommit Django declares it WITH HOLD, which makes the server compute and
    # store the whole result before the first row comes back.
    with transaction.atomic():
        checked, broken = _walk(
            entries.values_list(*_VERIFIED_COLUMNS).iterator(chunk_size=chunk_size),
            started=started,
            progress=progress,
            progress_every=max(1, progress_every),
        )
    if progress is not None:
        progress(VerifyProgress(checked, time.monotonic() - started, done=True))
    return checked, broken


def _walk(
    rows: Iterable[tuple[Any, ...]],
    *,
    started: float,
    progress: Callable[[VerifyProgress], None] | None,
    progress_every: int,
) -> tuple[int, ChainBreak | None]:
    checked = 0
    current_run: object = object()
    expected_prev = GENESIS_HASH
    expected_seq = 1
    for values in rows:
        entry = _Row._make(values)
        if entry.run_id != current_run:
            current_run = entry.run_id
            expected_prev, expected_seq = GENESIS_HASH, 1
        checked += 1
        problem = _entry_problem(entry, expected_prev, expected_seq)
        if problem:
            return checked, ChainBreak(entry.pk, entry.run_id, entry.run_seq, problem)
        expected_prev, expected_seq = entry.hash, entry.run_seq + 1
        if progress is not None and checked % progress_every == 0:
            progress(VerifyProgress(checked, time.monotonic() - started))
    return checked, None


def _entry_problem(entry: _Row, expected_prev: str, expected_seq: int) -> str:
    if entry.run_seq != expected_seq:
        return (
            f"sequence gap: expected {expected_seq}, found {entry.run_seq} (an entry was removed)"
        )
    if entry.prev_hash != expected_prev:
        return "prev_hash does not match the previous entry's hash"
    recomputed = entry_hash(
        run_id=entry.run_id,
        run_seq=entry.run_seq,
        at=_timestamp(entry.at),
        actor_kind=entry.actor_kind,
        actor_id=entry.actor_id,
        actor=entry.actor,
        action=entry.action,
        reason=entry.reason,
        payload=entry.payload,
        prev_hash=entry.prev_hash,
    )
    if recomputed != entry.hash:
        return "content does not match its hash (the row was changed)"
    return ""
