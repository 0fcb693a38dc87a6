"""`GET /metrics`: who may scrape it, and the figures for a small scenario we know by heart."""

from __future__ import annotations

import math

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from handoff.models import Handoff
from handoff.selectors import stop_quality
from runs import services
from runs.actors import Actor
from runs.errors import StaleEpoch
from runs.models import RejectedWrite, Run, RunStatus, StopReason, StopRequest
from runs.selectors import queue_depths
from runs.tokens import api_token_create, api_token_revoke
from tests.support.metrics import URL, parse, value
from tests.support.scenarios import SYSTEM, make_run, make_running, run_interrupt

pytestmark = pytest.mark.django_db

# --------------------------------------------------------------------------------------------
# who may scrape


def test_anonymous_is_refused_with_401_and_a_bearer_challenge(client):
    response = client.get(URL)
    assert response.status_code == 401
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert b"safestop_" not in response.content


def test_a_logged_in_user_who_is_not_staff_is_refused(client, alice):
    client.force_login(alice)  # a team admin, but not staff
    assert client.get(URL).status_code == 403


def test_an_agent_token_is_refused(client, agent_token):
    assert client.get(URL, **agent_token.header).status_code == 403


def test_unknown_malformed_and_revoked_tokens_are_refused(client, reviewer_token):
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer ss_not-a-real-token").status_code == 401
    assert client.get(URL, HTTP_AUTHORIZATION="Basic dXNlcjpwdw==").status_code == 401
    api_token_revoke(token_id=reviewer_token.token.pk, actor=SYSTEM)
    assert client.get(URL, **reviewer_token.header).status_code == 401


def test_staff_session_and_reviewer_token_are_served_prometheus_text(client, reviewer_token, db):
    staff = get_user_model().objects.create_user(username="ops", password="pw", is_staff=True)
    client.force_login(staff)
    as_staff = client.get(URL)
    assert as_staff.status_code == 200
    assert as_staff["Content-Type"].startswith("text/plain; version=0.0.4")
    client.logout()
    as_token = client.get(URL, **reviewer_token.header)
    assert as_token.status_code == 200
    parse(as_token.content.decode())


def test_writes_and_bad_windows_are_refused(client, reviewer_token):
    assert client.post(URL, **reviewer_token.header).status_code == 405
    assert client.get(URL + "?window=abc", **reviewer_token.header).status_code == 400
    assert client.get(URL + "?window=5", **reviewer_token.header).status_code == 400


# --------------------------------------------------------------------------------------------
# the figures


@pytest.fixture
def scenario(team, other_team, bob, settings):
    """acme: two clean stops (one at once, one drained by its worker, with a late permit and a
    pushed signal), an interruption that was resumed, a takeover whose handoff is still open, and
    a running run with two pending outbox items. globex: one stop of its own."""
    reviewer = Actor.for_user(bob)
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.test"]

    pending = make_run(team)
    services.run_stop(run_id=pending.pk, reason=StopReason.USER_STOP, actor=reviewer)

    running, lease = make_running(team)
    services.run_stop(run_id=running.pk, reason=StopReason.USER_STOP, actor=reviewer)
    services.stop_signal_delivered(run_id=running.pk, stop_epoch=lease.epoch + 1)
    with pytest.raises(StaleEpoch):
        services.permit_request(
            run_id=running.pk,
            epoch=lease.epoch,
            tool_call_id="call_late",
            tool="search",
            actor=SYSTEM,
        )
    services.run_drained(
        run_id=running.pk, lease_token=lease.token, epoch=lease.epoch, actor=SYSTEM
    )

    interrupted, _ = make_running(team)
    run_interrupt(run_id=interrupted.pk)
    services.run_resume(run_id=interrupted.pk, actor=reviewer)

    taken = make_run(team)
    services.run_takeover(run_id=taken.pk, actor=reviewer)

    busy, busy_lease = make_running(team)
    for key in ("mail-1", "mail-2"):
        services.outbox_enqueue(
            run_id=busy.pk,
            epoch=busy_lease.epoch,
            transport="webhook",
            destination="https://hooks.example.test/notify",
            payload={"key": key},
            idempotency_key=key,
            actor=SYSTEM,
        )

    foreign = make_run(other_team)
    services.run_stop(run_id=foreign.pk, reason=StopReason.USER_STOP, actor=SYSTEM)
    return {"running": running, "taken": taken}


def test_the_scenario_is_what_the_figures_claim(scenario):
    """Guard the scenario itself, so the endpoint tests below compare with known truths."""
    assert (
        StopRequest.objects.filter(run__team__slug="acme").count() == 3
    )  # pending, running, takeover
    assert RejectedWrite.objects.count() == 1
    # Taken over by a person: their handoff starts accepted by them.
    assert Handoff.objects.get(run=scenario["taken"]).status == "accepted"
    assert Run.objects.get(pk=scenario["taken"].pk).status == RunStatus.HANDED_OFF
    assert queue_depths(team_ids=None)["outbox_pending"] == 2


def test_reviewer_token_sees_its_teams_five_figures_and_queue_depths(
    client, reviewer_token, scenario
):
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())

    assert value(samples, "safestop_stops", outcome="all") == 3
    assert value(samples, "safestop_stops", outcome="stopped_cleanly") == 3
    assert value(samples, "safestop_stops", outcome="stopped_dirty") == 0
    # 1. latency: three stops reached stopped_*, one signal was pushed to a worker
    assert value(samples, "safestop_stop_latency_samples", to="stopped") == 3
    assert value(samples, "safestop_stop_latency_samples", to="worker_signal") == 1
    stop = StopRequest.objects.get(run=scenario["running"])
    drained_ms = (stop.stopped_at - stop.requested_at).total_seconds()
    assert value(
        samples, "safestop_stop_latency_seconds", to="stopped", quantile="0.99"
    ) == pytest.approx(drained_ms)
    assert (
        value(samples, "safestop_stop_latency_seconds", to="stopped", quantile="0.5") == 0.0
    )  # settled at once
    signal_seconds = (stop.signal_delivered_at - stop.requested_at).total_seconds()
    assert value(
        samples, "safestop_stop_latency_seconds", to="worker_signal", quantile="0.95"
    ) == pytest.approx(signal_seconds)
    # 2. leakage
    assert value(samples, "safestop_side_effect_leakage", kind="permit") == 0
    assert value(samples, "safestop_side_effect_leakage", kind="dispatch") == 0
    # 3. late writes
    assert value(samples, "safestop_late_writes_rejected") == 1
    # 4. interruptions
    assert value(samples, "safestop_interruptions", state="interrupted") == 1
    assert value(samples, "safestop_interruptions", state="recovered_cleanly") == 1
    assert value(samples, "safestop_interruptions_recovered_ratio") == 1.0
    # 5. handoffs
    assert value(samples, "safestop_handoffs", state="created") == 1
    assert value(samples, "safestop_handoffs", state="finished") == 0
    assert value(samples, "safestop_handoff_completion_ratio") == 0.0
    # queues
    assert value(samples, "safestop_queue_depth", queue="outbox_pending") == 2
    assert value(samples, "safestop_queue_depth", queue="outbox_frozen") == 0
    assert value(samples, "safestop_queue_depth", queue="runs_stopping") == 0
    assert value(samples, "safestop_metrics_window_seconds") == 86400


def test_staff_see_every_team_and_a_token_only_its_own(
    client, reviewer_token, outsider_token, scenario, db
):
    staff = get_user_model().objects.create_user(username="ops", password="pw", is_staff=True)
    client.force_login(staff)
    everyone = parse(client.get(URL).content.decode())
    assert value(everyone, "safestop_stops", outcome="all") == 4  # acme's three and globex's one
    client.logout()
    _token, raw = api_token_create(team_slug="globex", name="globex-reviewer", role="reviewer")
    globex = parse(client.get(URL, HTTP_AUTHORIZATION=f"Bearer {raw}").content.decode())
    assert value(globex, "safestop_stops", outcome="all") == 1
    assert (
        value(globex, "safestop_queue_depth", queue="outbox_pending") == 0
    )  # acme's items are not globex's


def test_figures_equal_the_stop_quality_api_for_the_same_scope(client, reviewer_token, scenario):
    """The endpoint renders `handoff.selectors.stop_quality`; nothing is computed twice."""
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    now = timezone.now()
    figures = stop_quality(
        since=now - timezone.timedelta(hours=24), until=now, team_ids=[reviewer_token.token.team_id]
    )
    assert value(samples, "safestop_stops", outcome="all") == figures["stops"]
    assert value(samples, "safestop_late_writes_rejected") == figures["late_writes_rejected"]
    assert (
        value(samples, "safestop_side_effect_leakage", kind="permit")
        == figures["side_effect_leakage"]["permits_after_stop"]
    )


def test_no_samples_is_nan_not_zero(client, reviewer_token):
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    assert math.isnan(
        value(samples, "safestop_stop_latency_seconds", to="stopped", quantile="0.99")
    )
    assert math.isnan(value(samples, "safestop_handoff_completion_ratio"))
    assert value(samples, "safestop_stops", outcome="all") == 0


def test_the_window_narrows_the_figures(client, reviewer_token, scenario):
    # Move every acme stop outside a one-minute window: the figures follow, the queues do not.
    StopRequest.objects.update(requested_at=timezone.now() - timezone.timedelta(hours=2))
    samples = parse(client.get(URL + "?window=60", **reviewer_token.header).content.decode())
    assert value(samples, "safestop_metrics_window_seconds") == 60
    assert value(samples, "safestop_stops", outcome="all") == 0
    assert value(samples, "safestop_queue_depth", queue="outbox_pending") == 2


def test_queue_depths_count_each_state_once(team, settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.test"]
    run, lease = make_running(team)
    for key in ("a", "b", "c"):
        services.outbox_enqueue(
            run_id=run.pk,
            epoch=lease.epoch,
            transport="webhook",
            destination="https://hooks.example.test/x",
            payload={},
            idempotency_key=key,
            actor=SYSTEM,
        )
    services.run_stop(run_id=run.pk, reason=StopReason.USER_STOP, actor=SYSTEM)
    depths = queue_depths(team_ids=[team.pk])
    assert depths == {
        "outbox_pending": 0,
        "outbox_dispatching": 0,
        "outbox_frozen": 3,
        "outbox_unknown": 0,
        "runs_stopping": 1,
        "runs_stopped_dirty": 0,
    }
    assert queue_depths(team_ids=[team.pk + 999]) == dict.fromkeys(depths, 0)


def test_metrics_and_the_stop_quality_api_agree(client, reviewer_token, scenario):
    """DESIGN §7 figures are the same whether scraped or asked for over the API."""
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    api = client.get("/api/v1/metrics/stop-quality/", **reviewer_token.header)
    assert api.status_code == 200
    figures = api.json()
    assert value(samples, "safestop_stops", outcome="all") == figures["stops"] == 3
    assert value(samples, "safestop_late_writes_rejected") == figures["late_writes_rejected"] == 1
    assert (
        value(samples, "safestop_side_effect_leakage", kind="dispatch")
        == (figures["side_effect_leakage"]["dispatches_after_stop"])
    )
    assert (
        value(samples, "safestop_interruptions", state="recovered_cleanly")
        == (figures["interruptions_recovered_cleanly"]["recovered_cleanly"])
    )
    assert (
        value(samples, "safestop_handoffs", state="created")
        == figures["handoff_completion"]["handoffs"]
    )
    assert (
        value(samples, "safestop_stop_latency_samples", to="stopped")
        == figures["stop_latency"]["to_stopped"]["count"]
    )


# --------------------------------------------------------------------------------------------
# cost (DESIGN §13)


def test_cost_and_tokens_are_counted_per_team_agent_model_and_type(
    client, team, other_team, reviewer_token
):
    def report(run, *events):
        services.events_ingest(
            run_id=run.pk,
            epoch=1,
            actor=SYSTEM,
            events=[{"type": "usage", **event} for event in events],
        )

    ours, _ = make_running(team)
    report(
        ours,
        {
            "event_id": "a",
            "model": "gpt-4o",
            "input_tokens": 100,
            "output_tokens": 10,
            "cost_usd": 0.25,
        },
        {
            "event_id": "b",
            "model": "gpt-4o",
            "input_tokens": 50,
            "output_tokens": 5,
            "cache_read_tokens": 20,
            "cost_usd": 0.5,
        },
        {"event_id": "c", "model": "acme-llm", "input_tokens": 7, "output_tokens": 3},
    )
    theirs, _ = make_running(other_team)
    report(
        theirs,
        {"event_id": "d", "model": "gpt-4o", "input_tokens": 1, "output_tokens": 1, "cost_usd": 9},
    )
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    cost = "safestop_cost_usd_total"
    assert value(samples, cost, team="acme", agent="report-bot", model="gpt-4o") == 0.75
    # An unpriced model has no cost sample (not 0); its tokens are counted apart.
    assert (
        cost,
        frozenset({("team", "acme"), ("agent", "report-bot"), ("model", "acme-llm")}),
    ) not in samples
    assert (
        value(
            samples,
            "safestop_unpriced_tokens_total",
            team="acme",
            agent="report-bot",
            model="acme-llm",
        )
        == 10
    )
    tokens = "safestop_tokens_total"
    assert value(samples, tokens, team="acme", type="input") == 157
    assert value(samples, tokens, team="acme", type="output") == 18
    assert value(samples, tokens, team="acme", type="cache_read") == 20
    assert value(samples, tokens, team="acme", type="cache_write") == 0
    # A reviewer token sees its own team only.
    assert not any(dict(labels).get("team") == "globex" for _name, labels in samples)
