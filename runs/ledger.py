"""The tamper-evident ledger: an append-only, per-run hash chain.

`ledger_append` is called by every transition inside its transaction, after the run row is
locked, so the per-run chain is written by one transaction at a time. Entries without a run
(token creation, …) form their own chain; a unique constraint on their sequence refuses a fork
and the append is retried.

Triggers refuse UPDATE, DELETE and TRUNCATE; someone who can switch them off (a database
superuser) is met by two more things. Each hash is an HMAC with a key the database does not hold
(runs/ledger_keys.py), so a changed entry cannot be made to verify again; and the walks anchor
the chains' heads outside the database (runs/ledger_anchors.py), so a chain cut short after an
anchor is found too. docs/OPERATIONS.md says what such a writer can still hide.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from django.core.serializers.json import DjangoJSONEncoder
from django.db import IntegrityError, transaction
from django.utils import timezone

from runs import hooks, sql
from runs.actors import Actor
from runs.ledger_anchors import AnchorHead, Pin, anchors_load
from runs.ledger_keys import LedgerKey, key_by_id, signing_key
from runs.models import LedgerEntry, Run

GENESIS_HASH = "0" * 64


def _canonical(value: Any) -> Any:
    return json.loads(json.dumps(value, cls=DjangoJSONEncoder, sort_keys=True))


# How an entry's `hash` is made (`LedgerEntry.hash_version`).
# A plain SHA-256 that leaves team_slug out: entries written before the chain was keyed. Anyone
# who can write the database can recompute one, so they verify only where an anchor (written
# outside the database) pins their chain at or past them, or while no anchor exists at all.
LEGACY_HASH = 1
# An HMAC-SHA256, with a ledger key the database does not hold, over every column but the
# database id: what every entry is written with.
KEYED_HASH = 2


def _body(fields: dict[str, Any]) -> bytes:
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def entry_hash(
    *,
    key: LedgerKey,
    run_id: str | None,
    run_seq: int,
    at: str,
    actor_kind: str,
    actor_id: str,
    actor: str,
    team_slug: str,
    action: str,
    reason: str,
    payload: Any,
    prev_hash: str,
) -> str:
    """The keyed hash (`KEYED_HASH`) of an entry with these columns, signed with `key`.

    The columns go in as one JSON array in this fixed order: no key names to write or sort, which
    makes it cheaper than the plain hash's object was, on every append and every entry walked.
    Every value is plain JSON already (the payload went through `_canonical`, or came out of a
    JSON column), so the C encoder needs no DjangoJSONEncoder."""
    return key.sign(
        json.dumps(
            [
                KEYED_HASH,
                key.id,
                run_id,
                run_seq,
                at,
                actor_kind,
                actor_id,
                actor,
                team_slug,
                action,
                reason,
                payload,
                prev_hash,
            ],
            sort_keys=True,
            separators=(",", ":"),
        ).encode()
    )


def legacy_entry_hash(
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
    """The unkeyed hash (`LEGACY_HASH`) entries were written with before the chain was keyed."""
    body = _body(
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
        }
    )
    return hashlib.sha256(body).hexdigest()


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


# A run chain's head, read before every append of a transition: compiled once per process
# (a transition may read it in a pipeline with its other reads: `chain_head_from`).
RUN_CHAIN_HEAD = sql.OnceCompiled(
    lambda run_id: (
        LedgerEntry.objects.filter(run_id=run_id).order_by("-run_seq").values("run_seq", "hash")[:1]
    ),
    "run_sample_5afe",
)


def chain_head(run: Run | None) -> ChainHead:
    if run is not None:
        return chain_head_from(RUN_CHAIN_HEAD.rows(run.pk))
    last = LedgerEntry.objects.filter(run=None).order_by("-run_seq").only("run_seq", "hash").first()
    return ChainHead(last.run_seq, last.hash) if last else EMPTY_CHAIN


def chain_head_from(rows: list[dict[str, Any]]) -> ChainHead:
    """`chain_head` from the rows of `RUN_CHAIN_HEAD`."""
    return ChainHead(rows[0]["run_seq"], rows[0]["hash"]) if rows else EMPTY_CHAIN


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
    pending = _new_entry(
        run=run,
        actor=actor,
        action=action,
        reason=reason,
        payload=payload,
        team_slug=team_slug,
        head=head,
    )
    # Every transition appends: its INSERT is built once, not compiled by the ORM each time.
    if sql.prepared_statements():
        sql.insert(pending.entry)
    else:
        pending.entry.save(force_insert=True)
    pending.written(pending.entry.pk)
    return pending.entry


@dataclass(frozen=True)
class PendingEntry:
    """A run's next entry, hashed but not written: for a transition that sends its INSERT in the
    same round trip as its own write (`sql.pipelined`), then calls `written` with the key."""

    entry: LedgerEntry
    run: Run | None

    def statement(self) -> tuple[str, list[Any]]:
        return sql.insert_statement(LedgerEntry), sql.insert_params(self.entry)

    @property
    def listened(self) -> bool:
        """A ledger listener may write for this entry (in `written`): its transaction must stay
        open after the entry's INSERT."""
        return hooks.entry_listened(self.entry.action)

    def written(self, pk: int) -> None:
        sql.saved_as(self.entry, pk)
        if self.run is not None:
            self.run._ledger_appended = ChainHead(  # type: ignore[attr-defined]
                self.entry.run_seq, self.entry.hash
            )
        # Same transaction as the entry: what listeners write (notification rows) commits with it.
        hooks.entry_appended(self.entry, self.run)


def ledger_entry_pending(
    *,
    run: Run,
    actor: Actor,
    action: str,
    payload: dict[str, Any],
    head: ChainHead | None = None,
    reason: str = "",
) -> PendingEntry | None:
    """`ledger_append`'s entry of `run`, not yet written, or None where it must go through the
    ORM (SQLite, a `pre_save`/`post_save` listener): the caller then calls `ledger_append`. Call
    it under the run lock, and write the entry before anything else appends to the chain."""
    if sql.prepared_statements():
        return _new_entry(
            run=run,
            actor=actor,
            action=action,
            reason=reason,
            payload=_canonical(payload),
            team_slug=run.team.slug,
            head=head,
        )
    return None


def _new_entry(
    *,
    run: Run | None,
    actor: Actor,
    action: str,
    reason: str,
    payload: Any,
    team_slug: str,
    head: ChainHead | None = None,
) -> PendingEntry:
    head = head or chain_head(run)
    # A head read early in a transition (the permit reads it with its other reads) goes stale
    # when something in between appends to the same chain under the same lock (a policy's
    # observe or notify entry): the entries this run object appended since win.
    appended = getattr(run, "_ledger_appended", None)
    if appended is not None and appended.run_seq > head.run_seq:
        head = appended
    run_seq = head.run_seq + 1
    prev_hash = head.hash
    # Truncate to microseconds as stored, so the verifier recomputes the very same string.
    at = timezone.now()
    key = signing_key()
    digest = entry_hash(
        key=key,
        run_id=run.pk if run else None,
        run_seq=run_seq,
        at=_timestamp(at),
        actor_kind=actor.kind,
        actor_id=actor.id,
        actor=actor.name,
        team_slug=team_slug,
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
        hash_version=KEYED_HASH,
        key_id=key.id,
    )
    return PendingEntry(entry, run)


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
    "team_slug",
    "action",
    "reason",
    "payload",
    "prev_hash",
    "hash",
    "hash_version",
    "key_id",
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
    team_slug: str
    action: str
    reason: str
    payload: Any
    prev_hash: str
    hash: str
    hash_version: int
    key_id: str


@dataclass
class AnchorReport:
    """What a walk learnt about anchors, for the caller that writes the next one: how many
    anchored heads it found again, and the heads of the chains that grew since (`moved`)."""

    anchored: int = 0
    moved: list[AnchorHead] = field(default_factory=list)


def ledger_verify(
    *,
    run_id: str | None = None,
    progress: Callable[[VerifyProgress], None] | None = None,
    progress_every: int = VERIFY_PROGRESS_EVERY,
    chunk_size: int = VERIFY_CHUNK,
    report: AnchorReport | None = None,
) -> tuple[int, ChainBreak | None]:
    """Walk every chain (or one run's); return (entries checked, first break or None).

    Each entry's hash is recomputed (keyed with the key it names), each chain is checked against
    the anchors written outside the database (`runs.ledger_anchors`): an anchored head must still
    be there with the same hash, so a chain cut short or deleted whole is a break too.

    Memory stays bounded whatever the ledger's size: rows stream in `chunk_size` batches and
    only the previous entry's hash is kept (and the anchored heads, one per chain). `progress`
    is called every `progress_every` entries and once at the end, for a command's output or a
    task's log. `report` collects what the next anchor needs.
    """
    # The anchors are read before the walk's snapshot is taken: every head they pin was
    # committed before it, so a head the walk cannot see was removed, not merely not yet seen.
    anchors = anchors_load()
    started = time.monotonic()
    if anchors.problem:
        return 0, ChainBreak(0, None, 0, anchors.problem)
    pins = anchors.pins
    if run_id is not None:
        pins = {run_id: anchors.pins[run_id]} if run_id in anchors.pins else {}
    entries = LedgerEntry.objects.order_by("run_id", "run_seq")
    if run_id is not None:
        entries = entries.filter(run_id=run_id)
    walk = _Walk(pins, any_anchor=anchors.files > 0, report=report or AnchorReport())
    # Inside a transaction, PostgreSQL's server-side cursor streams from the (run, run_seq)
    # index; in autocommit Django declares it WITH HOLD, which makes the server compute and
    # store the whole result before the first row comes back.
    with transaction.atomic():
        checked, broken = walk.run(
            entries.values_list(*_VERIFIED_COLUMNS).iterator(chunk_size=chunk_size),
            started=started,
            progress=progress,
            progress_every=max(1, progress_every),
        )
    if progress is not None:
        progress(VerifyProgress(checked, time.monotonic() - started, done=True))
    return checked, broken


_NO_CHAIN = object()


class _Walk:
    """One pass over the rows in (run, run_seq) order, chain after chain."""

    def __init__(self, pins: dict[str | None, Pin], *, any_anchor: bool, report: AnchorReport):
        self.pins = pins
        # Before the first anchor exists, an unkeyed entry cannot be told from a downgraded one:
        # the first clean walk anchors every chain, unkeyed ones included.
        self.any_anchor = any_anchor
        self.report = report
        self.keys: dict[str, LedgerKey | None] = {}

    def run(
        self,
        rows: Iterable[tuple[Any, ...]],
        *,
        started: float,
        progress: Callable[[VerifyProgress], None] | None,
        progress_every: int,
    ) -> tuple[int, ChainBreak | None]:
        checked = 0
        current_run: object = _NO_CHAIN
        last: _Row | None = None
        pin: Pin | None = None
        seen: set[str | None] = set()
        expected_prev = GENESIS_HASH
        expected_seq = 1
        keyed = False
        for values in rows:
            entry = _Row._make(values)
            if entry.run_id != current_run:
                if last is not None:
                    broken = self._chain_end(last, pin)
                    if broken:
                        return checked, broken
                current_run = entry.run_id
                seen.add(entry.run_id)
                pin = self.pins.get(entry.run_id)
                expected_prev, expected_seq, keyed = GENESIS_HASH, 1, False
            checked += 1
            problem = self._entry_problem(entry, expected_prev, expected_seq, pin, keyed)
            if problem:
                return checked, ChainBreak(entry.pk, entry.run_id, entry.run_seq, problem)
            keyed = keyed or entry.hash_version == KEYED_HASH
            expected_prev, expected_seq, last = entry.hash, entry.run_seq + 1, entry
            if progress is not None and checked % progress_every == 0:
                progress(VerifyProgress(checked, time.monotonic() - started))
        if last is not None:
            broken = self._chain_end(last, pin)
            if broken:
                return checked, broken
        for run_id, gone in self.pins.items():
            if run_id not in seen:
                return checked, ChainBreak(
                    gone.entry_id,
                    run_id,
                    gone.run_seq,
                    f"the chain has no entries left, but anchor {gone.anchor} "
                    f"({gone.written_at}) recorded it up to seq {gone.run_seq} "
                    "(the chain was deleted)",
                )
        return checked, None

    def _chain_end(self, last: _Row, pin: Pin | None) -> ChainBreak | None:
        if pin is not None:
            if last.run_seq < pin.run_seq:
                return ChainBreak(
                    pin.entry_id,
                    last.run_id,
                    pin.run_seq,
                    f"the chain ends at seq {last.run_seq}, but anchor {pin.anchor} "
                    f"({pin.written_at}) recorded it up to seq {pin.run_seq} "
                    "(entries were removed from its end)",
                )
            self.report.anchored += 1
        if pin is None or (last.run_seq, last.hash) != (pin.run_seq, pin.hash):
            self.report.moved.append(AnchorHead(last.run_id, last.run_seq, last.hash, last.pk))
        return None

    def _key(self, key_id: str) -> LedgerKey | None:
        if key_id not in self.keys:
            self.keys[key_id] = key_by_id(key_id)
        return self.keys[key_id]

    def _entry_problem(
        self, entry: _Row, expected_prev: str, expected_seq: int, pin: Pin | None, keyed: bool
    ) -> str:
        if entry.run_seq != expected_seq:
            return (
                f"sequence gap: expected {expected_seq}, found {entry.run_seq} "
                "(an entry was removed)"
            )
        if entry.prev_hash != expected_prev:
            return "prev_hash does not match the previous entry's hash"
        if entry.hash_version == KEYED_HASH:
            key = self._key(entry.key_id)
            if key is None:
                return (
                    f"signed with key {entry.key_id!r}, which SAFESTOP_LEDGER_KEY does not list "
                    "(keep retired keys after the current one)"
                )
            recomputed = entry_hash(
                key=key,
                run_id=entry.run_id,
                run_seq=entry.run_seq,
                at=_timestamp(entry.at),
                actor_kind=entry.actor_kind,
                actor_id=entry.actor_id,
                actor=entry.actor,
                team_slug=entry.team_slug,
                action=entry.action,
                reason=entry.reason,
                payload=entry.payload,
                prev_hash=entry.prev_hash,
            )
        elif entry.hash_version == LEGACY_HASH:
            # Unkeyed entries are only the ones written before the chain was keyed: never after
            # a keyed one, and never past what an anchor pinned. Otherwise anyone who can write
            # the database could mark an entry unkeyed and recompute its plain hash.
            if keyed or entry.key_id:
                return "an unkeyed entry after keyed ones (its hash format was changed)"
            if self.any_anchor and (pin is None or entry.run_seq > pin.run_seq):
                return "an unkeyed entry no anchor covers (its hash format was changed)"
            recomputed = legacy_entry_hash(
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
        else:
            return f"unknown hash version {entry.hash_version}"
        if recomputed != entry.hash:
            return "content does not match its hash (the row was changed)"
        if pin is not None and entry.run_seq == pin.run_seq and entry.hash != pin.hash:
            return (
                f"the hash differs from the one anchor {pin.anchor} ({pin.written_at}) "
                "recorded (the chain was rewritten)"
            )
        return ""
