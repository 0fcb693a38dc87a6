"""The printable packets list the approvals a stop or an interruption voided: the calls and items
that were waiting for a reviewer and will never run (id, tool, rule, who waited, a link)."""

from __future__ import annotations

import pytest

from runs import services
from runs.actors import Actor
from runs.models import RunStatus
from tests.support.scenarios import AGENT, new_run, run_interrupt, start

pytestmark = pytest.mark.django_db


def _waiting_approval(team):
    run = new_run(team, agent="billing-bot")
    lease = start(run)
    record, _ = services.permit_request(
        run_id=run.pk,
        epoch=lease.epoch,
        tool_call_id="charge-1",
        tool="payments.charge",
        side_effect="write",
        arguments={"amount": 120},
        needs_approval=True,
        summary="Charge 120",
        actor=AGENT,
    )
    return run, lease, record.approval


def test_the_stop_packet_page_lists_the_approvals_the_stop_voided(as_reviewer, team, bob):
    run, lease, approval = _waiting_approval(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob))
    services.run_drained(run_id=run.pk, lease_token=lease.token, epoch=lease.epoch, actor=AGENT)
    run.refresh_from_db()
    assert run.status == RunStatus.STOPPED_CLEANLY
    html = as_reviewer.get(f"/runs/{run.pk}/packets/{run.stop_epoch}/").content.decode()
    assert 'data-testid="void-approvals"' in html
    assert "Approvals voided by the stop" in html
    assert f'data-approval-id="{approval.public_id}"' in html
    assert f'href="/approvals/{approval.public_id}/"' in html
    assert "payments.charge" in html and "charge-1" in html
    assert "billing-bot" in html  # who was waiting
    assert "by bob" in html  # who voided it, by stopping
    assert "never ran" in html


def test_the_interruption_packet_lists_the_approvals_the_interruption_voided(as_reviewer, team):
    run, _lease, approval = _waiting_approval(team)
    run_interrupt(run_id=run.pk)
    run.refresh_from_db()
    assert run.status == RunStatus.INTERRUPTED
    html = as_reviewer.get(f"/runs/{run.pk}/packet/").content.decode()
    assert "Approvals voided by the interruption" in html
    assert f'data-approval-id="{approval.public_id}"' in html
    assert "Charge 120" in html


def test_a_packet_without_voided_approvals_says_none(as_reviewer, team, bob):
    run = new_run(team)
    services.run_stop(run_id=run.pk, reason="user_stop", actor=Actor.for_user(bob))
    run.refresh_from_db()
    html = as_reviewer.get(f"/runs/{run.pk}/packets/{run.stop_epoch}/").content.decode()
    assert 'data-testid="void-approvals"' in html
    assert 'Approvals voided by the stop <span class="count">0</span>' in html
