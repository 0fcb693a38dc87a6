"""Idle costs nothing: periodic work is woken at the next deadline and by changes, and beat is
only a slow safety net. Counted in queries and scheduled wakes, never timed."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import timedelta

import pytest
import redis
from django.db import connection
from django.test.utils import CaptureQueriesContext

from console.celery import SAFETY_NET_MIN_SECONDS, beat_schedule
from runs import dispatch, services, tasks
from runs.actors import Actor
from runs.models import Lease
from tests.support.isolation import suite_redis_url
from tests.support.scenarios import make_running, reload

pytestmark = pytest.mark.django_db

AGENT = Actor("api_client", "1", "agent-1")
REVIEWER = Actor("user", "2", "bob")
REVIEWER = Actor("user", "2", "bob")


@pytest.fixture
def scheduled(monkeypatch) -> list[dict]:
    """Every `wake` this process schedules (the broker is not asked)."""
    calls: list[dict] = []
    monkeypatch.setattr(tasks.wake, "apply_async", lambda **kwargs: calls.append(kwargs))
    return calls


def test_nothing_is_due_on_an_idle_server_and_asking_is_a_few_index_reads() -> None:
    with CaptureQueriesContext(connection) as queries:
        assert dispatch.next_deadline() is None
    # leases, stops, dispatches, two for approvals, two for budgets, two for notifications
    assert len(queries.captured_queries) <= 10, [q["sql"] for q in queries.captured_queries]


def test_the_next_deadline_is_the_earliest_lease_expiry_or_drain_deadline(team, settings) -> None:
    settings.SAFESTOP_DRAIN_DEADLINE_SECONDS = 5
    run, lease = make_running(team, ttl=600)
    assert dispatch.next_deadline() == lease.expires_at

    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    stopping = reload(run)
    assert dispatch.next_deadline() == stopping.stop_requested_at + timedelta(seconds=5)


def test_an_idle_server_schedules_no_wake_and_a_lease_schedules_one_at_its_expiry(
    team, scheduled, settings
) -> None:
    settings.REDIS_URL = ""  # no shared store: every call schedules (the dedupe is below)
    assert tasks.schedule_next_wake() is False
    assert scheduled == []

    _run, lease = make_running(team, ttl=30)
    assert tasks.schedule_next_wake() is True
    [wake] = scheduled
    expected = (lease.expires_at - lease.acquired_at).total_seconds()
    assert expected - 2 < wake["countdown"] <= expected + tasks.WAKE_MARGIN_SECONDS


def test_one_wake_is_scheduled_at_a_time_however_many_changes_ask(
    team, scheduled, settings, monkeypatch
) -> None:
    settings.REDIS_URL = suite_redis_url()
    monkeypatch.setenv("SAFESTOP_CELERY_QUEUE", f"wake-test-{uuid.uuid4().hex[:8]}")
    client = redis.Redis.from_url(suite_redis_url())
    try:
        _run, lease = make_running(team, ttl=30)
        assert [tasks.schedule_next_wake() for _ in range(5)] == [True, False, False, False, False]
        # an earlier deadline gets a wake of its own; the later one is then not rescheduled
        Lease.objects.filter(pk=lease.pk).update(
            expires_at=lease.expires_at - timedelta(seconds=10)
        )
        assert tasks.schedule_next_wake() is True
        assert tasks.schedule_next_wake() is False
        assert len(scheduled) == 2
        assert scheduled[1]["countdown"] < scheduled[0]["countdown"]
    finally:
        client.delete(tasks._wake_key())
        client.close()


def test_a_stop_that_froze_items_queues_a_relabel_and_an_enqueue_wakes_this_process(
    monkeypatch,
) -> None:
    queued: list[tuple[str, dict]] = []

    class Recorder:
        def __init__(self, name: str) -> None:
            self.name = name

        def apply_async(self, **options) -> None:
            queued.append((self.name, options))

    for name in ("dispatch_pending", "relabel_frozen_outbox", "schedule_wake"):
        task = getattr(tasks, name)
        monkeypatch.setattr(task, "_get_current_object", lambda name=name: Recorder(name))
    monkeypatch.setattr(tasks, "_ensure_kicker", lambda: None)
    woken: list[object] = []

    class LocalDispatcher:
        def wake(self, *, on_leftover, item_id=None) -> None:
            woken.append(on_leftover)

    monkeypatch.setattr(tasks, "local_dispatcher", LocalDispatcher())
    tasks._kicks.clear()

    tasks._kick_dispatch({"kind": "events", "run_id": "r"})
    tasks._kick_dispatch({"kind": "tool.permitted", "run_id": "r"})
    assert tasks._kicks == {}
    tasks._kick_dispatch({"kind": "run.stop_requested", "run_id": "r", "frozen_outbox": 0})
    assert set(tasks._kicks) == {"wake"}
    tasks._kick_dispatch({"kind": "run.stop_requested", "run_id": "r", "frozen_outbox": 3})
    assert woken == []
    # An enqueue wakes this process's own dispatcher; Celery hears only of what it leaves.
    tasks._kick_dispatch({"kind": "outbox.enqueued", "run_id": "r"})
    assert set(tasks._kicks) == {"wake", ("relabel", "r")}
    [leftover] = woken
    leftover()
    assert set(tasks._kicks) == {"wake", ("relabel", "r"), "dispatch"}
    relabel = tasks._kicks[("relabel", "r")][1]
    assert relabel == {"kwargs": {"run_id": "r"}, "countdown": tasks.RELABEL_DELAY_SECONDS}
    tasks._kicks.clear()


def test_beat_is_a_safety_net_that_never_ticks_faster_than_its_minimum() -> None:
    schedule = beat_schedule(0.5)
    assert min(float(entry["schedule"]) for entry in schedule.values()) >= SAFETY_NET_MIN_SECONDS


@pytest.mark.django_db(transaction=True)
def test_a_granted_permit_and_its_result_schedule_no_wake_a_held_call_does(team) -> None:
    """Asked of the kinds the services really emit: a granted call makes no deadline, so the
    busiest changes of a run cost no wake; a held call's approval has one."""
    from runs import notify

    kinds: list[str] = []

    def listen(event: dict) -> None:
        kinds.append(event.get("kind", ""))

    notify.subscribe(listen)
    try:
        run, _lease = make_running(team)
        kinds.clear()  # the run's creation and lease make deadlines of their own
        services.permit_request(
            run_id=run.pk, epoch=1, tool_call_id="c1", tool="lookup", actor=AGENT
        )
        services.tool_result_report(
            run_id=run.pk, tool_call_id="c1", execution_state="succeeded", actor=AGENT
        )
        granted = list(kinds)
        kinds.clear()
        services.permit_request(
            run_id=run.pk,
            epoch=1,
            tool_call_id="c2",
            tool="send_email",
            side_effect="write",
            needs_approval=True,
            actor=AGENT,
        )
        held = list(kinds)
    finally:
        notify.unsubscribe(listen)
    assert granted and held
    assert not any(kind not in tasks.NO_WAKE_KINDS for kind in granted), granted
    assert any(kind not in tasks.NO_WAKE_KINDS for kind in held), held


def _kinds_of(action: Callable[[], object]) -> list[str]:
    from runs import notify

    kinds: list[str] = []

    def listen(event: dict) -> None:
        kinds.append(event.get("kind", ""))

    notify.subscribe(listen)
    try:
        action()
    finally:
        notify.unsubscribe(listen)
    return kinds


@pytest.mark.django_db(transaction=True)
def test_a_stop_wakes_once_its_ack_and_clean_drain_do_not(team) -> None:
    """The stop makes the drain deadline; what follows while the worker drains only ends it, so
    it costs no wake (a wake's reads ran beside the drained answer and slowed it)."""
    run, lease = make_running(team)
    stopped = _kinds_of(
        lambda: services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)
    )
    acknowledged = _kinds_of(
        lambda: services.run_acknowledge_stop(run_id=run.pk, actor=AGENT, via="websocket")
    )
    drained = _kinds_of(
        lambda: services.run_drained(
            run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT
        )
    )

    assert reload(run).status == "stopped_cleanly"
    assert any(kind not in tasks.NO_WAKE_KINDS for kind in stopped), stopped
    assert acknowledged and drained
    assert not any(kind not in tasks.NO_WAKE_KINDS for kind in acknowledged + drained), (
        acknowledged,
        drained,
    )


@pytest.mark.django_db(transaction=True)
def test_a_dirty_drain_wakes_for_the_person_it_notifies(team) -> None:
    run, lease = make_running(team)
    services.permit_request(
        run_id=run.pk, epoch=1, tool_call_id="w1", tool="charge", side_effect="write", actor=AGENT
    )
    services.run_stop(run_id=run.pk, reason="user_stop", actor=REVIEWER)

    drained = _kinds_of(
        lambda: services.run_drained(
            run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT
        )
    )

    assert reload(run).status == "stopped_dirty"
    assert "run.stopped_dirty" in drained
    assert any(kind not in tasks.NO_WAKE_KINDS for kind in drained), drained
