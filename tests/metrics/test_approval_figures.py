"""Approval figures (DESIGN §10): time to decision and how approvals ended, the same on the
quality page, `/metrics` and `GET /api/v1/metrics/stop-quality/`.

The scenario goes through the real services only: a team rule and an agent's own
`needs_approval` hold calls and an outbox item; reviewers approve, approve with edits and
reject; the deadline sweep expires one; a stop voids one; one still waits.
"""

from __future__ import annotations

import math
from datetime import timedelta

import pytest
from django.utils import timezone

from handoff.selectors import stop_quality
from runs import services
from runs.actors import Actor
from runs.models import Approval, ApprovalStatus, StopReason
from tests.support.metrics import URL, parse, value
from tests.support.scenarios import SYSTEM, make_running

pytestmark = pytest.mark.django_db

API = "/api/v1/metrics/stop-quality/"
# How long before its decision each decided approval was asked for (seconds).
WAITED = {"approve": 10, "edit": 30, "reject": 60}


def _hold(run, lease, call_id: str, **extra) -> Approval:
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id=call_id,
        tool=extra.pop("tool", "payments.refund"),
        side_effect="write",
        arguments=extra.pop("arguments", {"amount": 120, "to": "acct_9"}),
        actor=SYSTEM,
        **extra,
    )
    assert record.approval.status == ApprovalStatus.WAITING
    return record.approval


def _asked_ago(approval: Approval, seconds: int) -> None:
    """The decision comes now; the request is moved back so the wait is known exactly."""
    Approval.objects.filter(pk=approval.pk).update(
        requested_at=timezone.now() - timedelta(seconds=seconds)
    )


@pytest.fixture
def approvals(team, other_team, bob, settings):
    settings.SAFESTOP_WEBHOOK_ALLOWED_HOSTS = ["hooks.example.test"]
    reviewer = Actor.for_user(bob)
    services.approval_rule_create(
        team_id=team.pk,
        actor=reviewer,
        name="Payments need a reviewer",
        tool_glob="payments.*",
        side_effect="write",
        risk="high",
        timeout_seconds=900,
        escalate_after_seconds=300,
    )
    run, lease = make_running(team)

    approved = _hold(run, lease, "call_approve")
    _asked_ago(approved, WAITED["approve"])
    services.approval_decide(approval_id=approved.pk, decision="approve", actor=reviewer)

    edited = _hold(run, lease, "call_edit")
    _asked_ago(edited, WAITED["edit"])
    services.approval_decide(
        approval_id=edited.pk,
        decision="approve",
        actor=reviewer,
        arguments={"amount": 50, "to": "acct_9"},
    )

    rejected = _hold(run, lease, "call_reject")
    _asked_ago(rejected, WAITED["reject"])
    services.approval_decide(
        approval_id=rejected.pk, decision="reject", actor=reviewer, message="wrong account"
    )

    # asked by the agent itself (no rule matches this tool), then left past its deadline
    expired = _hold(run, lease, "call_expire", tool="crm.delete", needs_approval=True)
    assert services.approval_expire(
        approval_id=expired.pk, now=expired.deadline + timedelta(seconds=1)
    )

    # an outbox item that still waits for a reviewer
    item, _ = services.outbox_enqueue(
        run_id=run.pk,
        epoch=lease.epoch,
        transport="webhook",
        destination="https://hooks.example.test/notify",
        payload={"text": "refund sent"},
        idempotency_key="notify-1",
        actor=SYSTEM,
        needs_approval=True,
    )
    assert item.approval.status == ApprovalStatus.WAITING

    # another run's approval, void because a reviewer stopped the run while it waited
    stopped, stopped_lease = make_running(team)
    void = _hold(stopped, stopped_lease, "call_void")
    services.run_stop(run_id=stopped.pk, reason=StopReason.USER_STOP, actor=reviewer)

    # globex: one approval of its own, never counted for acme
    foreign, foreign_lease = make_running(other_team)
    _hold(foreign, foreign_lease, "call_foreign", needs_approval=True)

    statuses = dict(
        Approval.objects.filter(team=team).values_list("execution_record__tool_call_id", "status")
    )
    assert statuses == {
        "call_approve": ApprovalStatus.APPROVED,
        "call_edit": ApprovalStatus.APPROVED,
        "call_reject": ApprovalStatus.REJECTED,
        "call_expire": ApprovalStatus.EXPIRED,
        "call_void": ApprovalStatus.VOID,
        None: ApprovalStatus.WAITING,  # the outbox item
    }
    assert Approval.objects.get(pk=void.pk).status == ApprovalStatus.VOID
    return run


def test_the_selector_counts_each_outcome_and_times_only_reviewer_decisions(team, approvals):
    now = timezone.now()
    figures = stop_quality(since=now - timedelta(hours=1), until=now, team_ids=[team.pk])[
        "approvals"
    ]
    assert {key: value for key, value in figures.items() if key != "time_to_decision"} == {
        "requested": 6,
        "approved": 2,
        "approved_with_edits": 1,
        "rejected": 1,
        "expired": 1,
        "void": 1,
        "waiting": 1,
    }
    timing = figures["time_to_decision"]
    # approve, edit, reject: the expiry (no person) and the void are not decisions
    assert timing["count"] == 3
    assert timing["p50_ms"] == pytest.approx(WAITED["edit"] * 1000, abs=2000)
    assert timing["p95_ms"] == timing["p99_ms"]
    assert timing["p99_ms"] == pytest.approx(WAITED["reject"] * 1000, abs=2000)
    everyone = stop_quality(since=now - timedelta(hours=1), until=now)["approvals"]
    assert everyone["requested"] == 7 and everyone["waiting"] == 2


def test_metrics_show_the_approval_figures_for_the_tokens_team(client, reviewer_token, approvals):
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    assert value(samples, "safestop_approvals", status="all") == 6
    for status, count in {
        "waiting": 1,
        "approved": 2,
        "approved_with_edits": 1,
        "rejected": 1,
        "expired": 1,
        "void": 1,
    }.items():
        assert value(samples, "safestop_approvals", status=status) == count, status
    assert value(samples, "safestop_approval_time_to_decision_samples") == 3
    assert value(
        samples, "safestop_approval_time_to_decision_seconds", quantile="0.5"
    ) == pytest.approx(WAITED["edit"], abs=2)
    assert value(
        samples, "safestop_approval_time_to_decision_seconds", quantile="0.99"
    ) == pytest.approx(WAITED["reject"], abs=2)


def test_metrics_and_the_api_give_the_same_approval_figures(client, reviewer_token, approvals):
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    response = client.get(API, **reviewer_token.header)
    assert response.status_code == 200
    figures = response.json()["approvals"]
    assert value(samples, "safestop_approvals", status="all") == figures["requested"] == 6
    for status in ("waiting", "approved", "approved_with_edits", "rejected", "expired", "void"):
        assert value(samples, "safestop_approvals", status=status) == figures[status], status
    timing = figures["time_to_decision"]
    assert value(samples, "safestop_approval_time_to_decision_samples") == timing["count"] == 3
    for quantile, key in (("0.5", "p50_ms"), ("0.95", "p95_ms"), ("0.99", "p99_ms")):
        assert value(
            samples, "safestop_approval_time_to_decision_seconds", quantile=quantile
        ) == pytest.approx(timing[key] / 1000)


def test_no_approvals_is_nan_time_and_zero_counts(client, reviewer_token):
    samples = parse(client.get(URL, **reviewer_token.header).content.decode())
    assert math.isnan(value(samples, "safestop_approval_time_to_decision_seconds", quantile="0.5"))
    assert value(samples, "safestop_approval_time_to_decision_samples") == 0
    assert value(samples, "safestop_approvals", status="all") == 0
    api = client.get(API, **reviewer_token.header).json()["approvals"]
    assert api["time_to_decision"] == {"count": 0, "p50_ms": None, "p95_ms": None, "p99_ms": None}


def test_the_quality_page_shows_the_approval_figures(client, charlie, approvals):
    client.force_login(charlie)  # a viewer of acme
    body = client.get("/quality/").content.decode()
    assert "Approvals: time to decision" in body
    section = body[body.index('id="fig-approvals"') :]
    section = section[: section.index("</article>")]
    for label, count in (
        ("requested", 6),
        ("approved", 2),
        ("approved with edits", 1),
        ("rejected", 1),
        ("expired", 1),
        ("void at a stop", 1),
    ):
        assert f"<dt>{label}</dt><dd>{count}</dd>" in section, label
    assert "/approvals/" in section  # the one still waiting links to the inbox
    assert "30.0 s" in section or "30.1 s" in section  # p50: the edited one's wait
    assert '3</span><span class="muted">decided by a reviewer' in section
