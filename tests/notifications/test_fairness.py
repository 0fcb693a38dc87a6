"""One team's agent cannot delay other teams' notifications: deliveries are claimed fairly
across teams, and a team's approval requests have a rate (429 with a reason past it)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from notifications import services as notify
from notifications.models import Delivery
from runs import services
from runs.models import Approval, ExecutionRecord
from tests.support.api import url
from tests.support.scenarios import AGENT, make_running

pytestmark = pytest.mark.django_db


def _flood(team, channel, count: int, *, minutes_ago: float) -> None:
    """`count` due deliveries of one team, queued before anyone else's."""
    queued = timezone.now() - timedelta(minutes=minutes_ago)
    Delivery.objects.bulk_create(
        Delivery(
            team=team,
            channel=channel,
            event="approval.waiting",
            event_key=f"approval.waiting:flood-{n}",
            message={"title": f"Approval waiting: flood {n}", "text": "", "link": ""},
            next_attempt_at=queued,
        )
        for n in range(count)
    )


def test_a_flooding_team_does_not_delay_another_teams_webhook(
    team, other_team, receiver, make_channel
):
    flooding, _ = make_channel(team, receiver.url("/acme"), name="acme-hook")
    quiet, quiet_secret = make_channel(other_team, receiver.url("/globex"), name="globex-hook")
    _flood(team, flooding, 500, minutes_ago=10)
    Delivery.objects.create(
        team=other_team,
        channel=quiet,
        event="run.stopped_dirty",
        event_key="run.stopped_dirty:quiet",
        message={"title": "Run stopped dirty", "text": "", "link": ""},
        next_attempt_at=timezone.now(),
    )
    # The first round of the sender (5 claims) already reaches the quiet team's target.
    notify.deliveries_send_due(limit=5, sender="test-sender")
    paths = [hit.path for hit in receiver.hits]
    assert "/globex" in paths and len(paths) == 5
    assert Delivery.objects.get(event_key="run.stopped_dirty:quiet").status == "sent"


def test_every_team_with_due_work_is_in_the_first_claim(team, other_team, make_channel, settings):
    from runs.tokens import team_ensure

    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example"]
    third = team_ensure(slug="initech", name="Initech")
    channels = {
        t.slug: make_channel(t, "https://hooks.example/x", name=f"{t.slug}-hook")[0]
        for t in (team, other_team, third)
    }
    _flood(team, channels["acme"], 300, minutes_ago=10)
    for minutes, t in ((5, other_team), (1, third)):
        Delivery.objects.create(
            team=t,
            channel=channels[t.slug],
            event="run.stopped_dirty",
            event_key=f"run.stopped_dirty:{t.slug}",
            message={"title": "x"},
            next_attempt_at=timezone.now() - timedelta(minutes=minutes),
        )
    claimed = notify.deliveries_claim_due(limit=6, claimer="c1")
    teams = list(Delivery.objects.filter(pk__in=claimed).values_list("team__slug", flat=True))
    assert len(claimed) == 6
    assert sorted(set(teams)) == ["acme", "globex", "initech"]
    assert teams.count("acme") == 4  # the flooding team takes what the others left
    # A second sender never gets a row the first one holds.
    again = notify.deliveries_claim_due(limit=6, claimer="c2")
    assert not set(claimed) & set(again) and len(again) == 6


# --------------------------------------------------------------------------------------------
# the per-team approval rate


def _ask(api, token, run, lease, n: int):
    return api.post(
        url(run, "permits/"),
        {
            "epoch": lease.epoch,
            "tool_call_id": f"call_{n}",
            "tool": "payments.charge",
            "side_effect": "write",
            "arguments": {"n": n},
            "needs_approval": True,
        },
        token,
    )


def test_a_team_past_its_approval_rate_gets_a_429_and_nothing_is_held(
    client, team, other_team, agent_token, outsider_token, settings
):
    from tests.support.api import Api

    settings.SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE = 3
    settings.SAFESTOP_RATE_LIMIT_PER_MINUTE = 0
    api = Api(client)
    run, lease = make_running(team)
    for n in range(3):
        assert _ask(api, agent_token, run, lease, n).status_code == 202
    refused = _ask(api, agent_token, run, lease, 3)
    assert refused.status_code == 429
    body = refused.json()
    assert body["error"] == "approval_rate_limited" and body["limit"] == 3
    assert "SAFESTOP_APPROVAL_REQUESTS_PER_MINUTE" in body["detail"]
    assert 1 <= int(refused["Retry-After"]) <= 60
    assert not ExecutionRecord.objects.filter(run=run, tool_call_id="call_3").exists()
    assert Approval.objects.filter(team=team).count() == 3

    # Another team is not slowed by this one.
    theirs, their_lease = make_running(other_team)
    assert _ask(api, outsider_token, theirs, their_lease, 0).status_code == 202

    # A call that needs no approval is not counted, and is not refused.
    permit = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="read_1",
        tool="search",
        side_effect="none",
        actor=AGENT,
    )
    assert permit[0].execution_state == "permitted"

    # Once the oldest request leaves the minute, the team may ask again.
    Approval.objects.filter(team=team).update(requested_at=timezone.now() - timedelta(minutes=2))
    assert _ask(api, agent_token, run, lease, 4).status_code == 202
