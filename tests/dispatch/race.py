"""The stop/dispatch leakage race, shared by its CI version (`test_leakage_race.py`) and the long
soak (`bench/soak.py`, `make soak`): the dispatcher processes, the supply of prepared runs, one
round of the race, and the tally of what went out.

A round takes one or more freshly prepared runs (each with pending outbox items), lets every
dispatcher scan its share of their items (a snapshot the stops will make stale; every item is in
exactly two snapshots, so the dispatchers also race each other), starts them all at once and
stops each run at its own moment inside the dispatch window. The tally then compares what the
database says with what the webhook receiver got: an item received although its run's stop had
frozen it, or claimed after the stop, or at another epoch, is a leak; a key received twice is a
duplicate.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tests.support.children import ROOT, child_env

# Where one round waits for a dispatcher's answer: generous, because the soak runs on shared CI
# cores and a long round dispatches hundreds of items per process.
ANSWER_TIMEOUT = 30.0


class DispatcherProcess:
    """`python -m tests.dispatch.dispatcher_proc` in its own process, spoken to line by line."""

    def __init__(self, *, allowed_hosts: str, env: dict[str, str] | None = None) -> None:
        self.stderr = tempfile.NamedTemporaryFile(prefix="dispatcher-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.dispatch.dispatcher_proc"],
            cwd=ROOT,
            env=env or child_env(SAFESTOP_WEBHOOK_ALLOWED_HOSTS=allowed_hosts),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.stderr,
            text=True,
            bufsize=1,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        hello = self.read(timeout=60)
        assert hello.startswith("hello "), hello
        self.pid = self.proc.pid

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put("<eof>")

    def read(self, timeout: float = ANSWER_TIMEOUT) -> str:
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"dispatcher {self.proc.pid} did not answer in {timeout}s; log: {self.log()}"
            ) from None
        return self._checked(line)

    def poll(self) -> str | None:
        """The next answer if one has arrived, else None (never blocks)."""
        try:
            return self._checked(self.lines.get_nowait())
        except queue.Empty:
            return None

    def _checked(self, line: str) -> str:
        if line.startswith("error") or line == "<eof>":
            raise AssertionError(f"dispatcher {self.proc.pid}: {line}; log: {self.log()}")
        return line

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str, timeout: float = ANSWER_TIMEOUT) -> str:
        self.send(command)
        return self.read(timeout)

    def log(self) -> str:
        return Path(self.stderr.name).read_text()[-3000:]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self.stderr.close()
        os.unlink(self.stderr.name)


class RunSupply:
    """Runs prepared by agent processes, handed out as they become ready.

    Preparing a run (a run, its lease, its outbox items, all through the services) costs more
    than racing it, so agents work ahead in batches while the race goes on."""

    def __init__(
        self,
        agents: Sequence[DispatcherProcess],
        *,
        team_slug: str,
        url: str,
        total: int,
        items: int,
        batch: int = 10,
    ) -> None:
        self.agents, self.team_slug, self.url = agents, team_slug, url
        self.items, self.batch = items, batch
        self.ready: deque[str] = deque()
        self.to_order = total
        self.busy: set[int] = set()
        for index in range(len(agents)):
            self._order(index)

    def _order(self, index: int) -> None:
        count = min(self.batch, self.to_order)
        if count <= 0:
            return
        self.to_order -= count
        self.agents[index].send(f"prep {self.team_slug} {count} {self.items} {self.url}")
        self.busy.add(index)

    def _collect(self, index: int, answer: str) -> None:
        self.ready.extend(answer.split(" ", 1)[1].split(","))
        self.busy.discard(index)
        self._order(index)

    def next(self) -> str:
        for index in list(self.busy):
            answer = self.agents[index].poll()
            if answer is not None:
                self._collect(index, answer)
        while not self.ready:
            index = next(iter(self.busy))
            self._collect(index, self.agents[index].read(timeout=300))
        return self.ready.popleft()

    def take(self, count: int) -> list[str]:
        return [self.next() for _ in range(count)]


def share(items: int, slot: int, slots: int) -> int:
    """How many of a run's items the dispatcher in `slot` scans (see dispatcher_proc's scan)."""
    return sum(1 for n in range(items) if n % slots in (slot, (slot + 1) % slots))


def race_round(
    dispatchers: Sequence[DispatcherProcess],
    run_ids: Sequence[str],
    offsets: Sequence[float] | None,
    *,
    items: int,
    stop: Callable[[str], object],
    on_go: Callable[[], None] | None = None,
    timeout: float = ANSWER_TIMEOUT,
) -> tuple[dict[str, object], float]:
    """Scan, go, and stop run i `offsets[i]` seconds after the go (None: only once every
    dispatcher is done). Returns each run's stop outcome and how long the dispatch took."""
    slots = len(dispatchers)
    joined = ",".join(run_ids)
    for slot, proc in enumerate(dispatchers):
        proc.send(f"scan {joined} {slot} {slots}")
    for slot, proc in enumerate(dispatchers):
        expected = f"ready {len(run_ids) * share(items, slot, slots)}"
        answer = proc.read(timeout)
        if answer != expected:
            raise AssertionError(f"dispatcher {proc.pid}: {answer!r}, expected {expected!r}")
    started = time.perf_counter()
    for proc in dispatchers:
        proc.send("go")
    if on_go is not None:
        on_go()
    outcomes: dict[str, object] = {}
    if offsets is not None:
        for run_id, offset in sorted(zip(run_ids, offsets, strict=True), key=lambda p: p[1]):
            pause = started + offset - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            outcomes[run_id] = stop(run_id)
    for proc in dispatchers:
        answer = proc.read(timeout)
        if not answer.startswith("done "):
            raise AssertionError(f"dispatcher {proc.pid}: {answer!r}")
    elapsed = time.perf_counter() - started
    if offsets is None:
        for run_id in run_ids:
            outcomes[run_id] = stop(run_id)
    return outcomes, elapsed


@dataclass
class Tally:
    """What went out, judged against each run's stop. `leaks` and `duplicates` must be 0."""

    runs: int = 0
    items: int = 0
    sent: int = 0
    frozen: int = 0
    other: Counter[str] = field(default_factory=Counter)  # failed / unknown / still dispatching
    receipts: int = 0
    duplicates: int = 0  # idempotency keys received more than once
    frozen_received: int = 0
    claimed_after_stop: int = 0
    wrong_epoch: int = 0
    inconsistent: int = 0  # frozen yet claimed, or frozen by another epoch than the stop's
    unknown_keys: int = 0  # received keys no raced run owns
    sent_not_received: int = 0
    in_flight_at_stop: int = 0  # sent after the stop committed, claimed before it: allowed
    runs_mixed: int = 0
    runs_all_frozen: int = 0
    runs_all_sent: int = 0
    examples: list[str] = field(default_factory=list)

    @property
    def leaks(self) -> int:
        return self.frozen_received + self.claimed_after_stop + self.wrong_epoch

    @property
    def clean(self) -> bool:
        return not (self.leaks or self.duplicates or self.inconsistent or self.unknown_keys)

    def note(self, problem: str) -> None:
        if len(self.examples) < 20:
            self.examples.append(problem)

    def line(self) -> str:
        other = ",".join(f"{k}={v}" for k, v in sorted(self.other.items())) or "0"
        return (
            f"runs={self.runs} items={self.items} sent={self.sent} frozen={self.frozen} "
            f"other={other} receipts={self.receipts} leaks={self.leaks} "
            f"(frozen_received={self.frozen_received} claimed_after_stop={self.claimed_after_stop} "
            f"wrong_epoch={self.wrong_epoch}) duplicates={self.duplicates} "
            f"inconsistent={self.inconsistent} "
            f"unknown_keys={self.unknown_keys} sent_not_received={self.sent_not_received} "
            f"in_flight_at_stop={self.in_flight_at_stop} runs_mixed={self.runs_mixed} "
            f"runs_all_frozen={self.runs_all_frozen} runs_all_sent={self.runs_all_sent}"
        )


ROW_FIELDS = (
    "idempotency_key",
    "run_id",
    "status",
    "claimed_at",
    "claim_epoch",
    "frozen_at",
    "frozen_by_epoch",
    "sent_at",
    "enqueue_epoch",
)


def _item_rows(run_ids: list[str]) -> Iterable[dict]:
    from runs.models import OutboxItem

    # In slices: the soak has ten thousand runs, more than one IN list should carry.
    for start in range(0, len(run_ids), 1000):
        yield from (
            OutboxItem.objects.filter(run_id__in=run_ids[start : start + 1000])
            .values(*ROW_FIELDS)
            .iterator(chunk_size=5000)
        )


def tally(stops: dict[str, object], received: Iterable[str], *, items: int) -> Tally:
    """Judge every item of the raced runs (`stops`: run id -> its `StopOutcome`) and every
    idempotency key the receiver got."""
    from runs.models import OutboxStatus

    result = Tally(runs=len(stops))
    rows: dict[str, dict] = {}
    sent_per_run: Counter[str] = Counter()
    for row in _item_rows(list(stops)):
        rows[row["idempotency_key"]] = row
        stop = stops[row["run_id"]].stop_request  # type: ignore[attr-defined]
        if row["status"] == OutboxStatus.PENDING and row["enqueue_epoch"] < stop.epoch_after:
            # Frozen by the stop's epoch, its row not relabelled yet (runs/frozen.py): what
            # every reader sees, and what the relabel will write.
            row.update(status=OutboxStatus.FROZEN, frozen_by_epoch=stop.epoch_after)
        if row["status"] == OutboxStatus.SENT:
            result.sent += 1
            sent_per_run[row["run_id"]] += 1
            result.in_flight_at_stop += row["sent_at"] > stop.requested_at
        elif row["status"] == OutboxStatus.FROZEN:
            result.frozen += 1
            if row["claimed_at"] is not None or row["frozen_by_epoch"] != stop.epoch_after:
                result.inconsistent += 1
                result.note(f"frozen item {row['idempotency_key']} is inconsistent: {row}")
        else:
            result.other[row["status"]] += 1
        if row["claimed_at"] is not None:
            if row["claimed_at"] >= stop.requested_at:
                result.claimed_after_stop += 1
                result.note(f"{row['idempotency_key']} claimed after its run's stop: {row}")
            elif row["claim_epoch"] != stop.epoch_before:
                result.wrong_epoch += 1
                result.note(f"{row['idempotency_key']} claimed at epoch {row['claim_epoch']}")
    result.items = len(rows)
    for run_id in stops:
        count = sent_per_run[run_id]
        result.runs_mixed += 0 < count < items
        result.runs_all_frozen += count == 0
        result.runs_all_sent += count == items

    counts = Counter(received)
    result.receipts = sum(counts.values())
    for key, times in counts.items():
        if times > 1:
            result.duplicates += 1
            result.note(f"{key} received {times} times")
        row = rows.get(key)
        if row is None:
            result.unknown_keys += 1
            result.note(f"received {key}, which no raced run owns")
        elif row["status"] == OutboxStatus.FROZEN:
            result.frozen_received += 1
            result.note(f"frozen item {key} was received")
    result.sent_not_received = sum(
        1 for key, row in rows.items() if row["status"] == OutboxStatus.SENT and key not in counts
    )
    return result
