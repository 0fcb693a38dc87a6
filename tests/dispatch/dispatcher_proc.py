"""A dispatcher in its own process, driven line by line over stdin (tests only).

    python -m tests.dispatch.dispatcher_proc      # env: DATABASE_URL=<the test database>

It is a real OS process with its own database connection, so it races the test process (and
its siblings) on PostgreSQL row locks exactly as separate Celery workers would, and it can be
killed with SIGKILL mid-send. Commands (one per line; each answers one line on stdout):

    prep <team_slug> <runs> <items> <url>   create running runs with <items> outbox items each
                                            (through the services) -> "prepped <id>,<id>,..."
    scan <run_id>[,<run_id>...] [<slot> <slots>]
                                            read the runs' pending item ids *now* (the
                                            dispatcher's scan) -> "ready <n>"; with a slot, keep
                                            the items whose position in their run modulo <slots>
                                            is <slot> or <slot>+1, so every item has exactly two
                                            contenders; several runs' items are interleaved (the
                                            first of each run, then the second, ...) so that
                                            every run is being dispatched all through the round
    go                                      dispatch_one() every scanned id, however stale the
                                            scan has become -> "done <claimed>"
    dispatch <item_id>                      dispatch_one(item) -> "dispatched <status or none>"
    pending <limit>                         dispatch_pending(limit) -> "pending <n>"
    quit
"""

from __future__ import annotations

import os
import sys
import traceback
from itertools import zip_longest


def scan(run_ids: list[str], slot: int | None = None, slots: int | None = None) -> list[int]:
    from runs.models import OutboxItem, OutboxStatus

    per_run: dict[str, list[int]] = {run_id: [] for run_id in run_ids}
    for run_id, pk in (
        OutboxItem.objects.filter(run_id__in=run_ids, status=OutboxStatus.PENDING)
        .order_by("created_at", "pk")
        .values_list("run_id", "pk")
    ):
        per_run[run_id].append(pk)
    if slot is not None and slots is not None:
        for run_id, pks in per_run.items():
            per_run[run_id] = [
                pk for n, pk in enumerate(pks) if n % slots in (slot, (slot + 1) % slots)
            ]
    return [pk for row in zip_longest(*per_run.values()) for pk in row if pk is not None]


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")
    import django

    django.setup()

    from console import realtime
    from runs import dispatch, notify, services
    from runs.actors import Actor
    from runs.models import Team
    from tests.support.scenarios import make_running

    # No browser is connected to this process: skip the in-memory channel publish (pure cost).
    notify.unsubscribe(realtime.publish)
    name = f"proc-{os.getpid()}"
    scanned: list[int] = []

    def answer(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    answer(f"hello {os.getpid()}")
    for raw in sys.stdin:
        words = raw.split()
        if not words:
            continue
        command, args = words[0], words[1:]
        try:
            if command == "quit":
                break
            if command == "prep":
                team = Team.objects.get(slug=args[0])
                run_ids = []
                for _ in range(int(args[1])):
                    run, _lease = make_running(team, ttl=900)
                    for seq in range(int(args[2])):
                        services.outbox_enqueue(
                            run_id=run.pk,
                            epoch=run.stop_epoch,
                            transport="webhook",
                            destination=args[3],
                            payload={"run": run.pk, "seq": seq},
                            idempotency_key=f"{run.pk}-{seq:02d}",
                            actor=Actor.system("agent"),
                        )
                    run_ids.append(run.pk)
                answer("prepped " + ",".join(run_ids))
            elif command == "scan":
                scanned = scan(args[0].split(","), *(int(arg) for arg in args[1:3]))
                answer(f"ready {len(scanned)}")
            elif command == "go":
                claimed = sum(
                    1
                    for item_id in scanned
                    if dispatch.dispatch_one(item_id, dispatcher=name) is not None
                )
                scanned = []
                answer(f"done {claimed}")
            elif command == "dispatch":
                item = dispatch.dispatch_one(int(args[0]), dispatcher=name)
                answer(f"dispatched {item.status if item else 'none'}")
            elif command == "pending":
                answer(f"pending {dispatch.dispatch_pending(limit=int(args[0]), dispatcher=name)}")
            else:
                answer(f"error unknown command {command}")
        except Exception:
            answer("error " + traceback.format_exc().replace("\n", " | "))


if __name__ == "__main__":
    main()
