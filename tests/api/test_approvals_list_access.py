"""Who may list a team's approvals is one answer, from the role table (`Capability.APPROVALS`):
the console's inbox and `GET /api/v1/approvals/` agree for every caller."""

from __future__ import annotations

import pytest
from django.test import Client

from runs import services
from runs.access import ROLE_CAPABILITIES, TOKEN_CAPABILITIES, Capability
from runs.models import Approval, Role, TokenRole
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db


@pytest.fixture
def waiting(team) -> Approval:
    run = new_run(team)
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="c1",
        tool="payments.charge",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    return Approval.objects.get(run=run)


def test_the_role_table_lets_every_member_list_approvals_and_no_agent_token():
    assert all(Capability.APPROVALS in ROLE_CAPABILITIES[role] for role in Role)
    assert Capability.APPROVALS in TOKEN_CAPABILITIES[TokenRole.REVIEWER]
    assert Capability.APPROVALS not in TOKEN_CAPABILITIES[TokenRole.AGENT]


@pytest.mark.parametrize("who", ["alice", "bob", "charlie", "outsider"])
def test_console_inbox_and_api_list_give_one_answer(request, waiting, who):
    user = request.getfixturevalue(who)
    client = Client()
    client.force_login(user)
    page = client.get("/approvals/")
    answer = client.get("/api/v1/approvals/")
    assert page.status_code == 200 and answer.status_code == 200
    in_console = [row.public_id for row in page.context["rows"]]
    in_api = [item["id"] for item in answer.json()["results"]]
    assert in_console == in_api
    assert in_api == ([] if who == "outsider" else [waiting.public_id])


def test_a_viewer_lists_but_still_may_not_decide(waiting, charlie):
    client = Client()
    client.force_login(charlie)
    assert client.get("/api/v1/approvals/").status_code == 200
    decide = client.post(
        f"/api/v1/approvals/{waiting.public_id}/decide/",
        {"decision": "approve"},
        content_type="application/json",
    )
    assert decide.status_code == 403
