"""Slack member ids are linked only with proof of control, a signed request with a malformed
payload is a 400, and every agent-supplied string sent to Slack is inert mrkdwn."""

from __future__ import annotations

import json
import re
import time
from datetime import timedelta
from urllib.parse import urlencode

import pytest
from django.test import Client
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from notifications import services as notify
from notifications.models import SlackLink, SlackLinkCode
from notifications.slack import slack_link_code_issue, slack_link_confirm
from runs import services
from runs.errors import InvalidInput
from runs.models import Approval, ApprovalStatus, LedgerEntry
from tests.support.scenarios import AGENT, new_run, start, stopped_dirty

pytestmark = pytest.mark.django_db

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
URL = "/integrations/slack/actions/"
CODE = re.compile(r"\b([A-Z2-9]{5}-[A-Z2-9]{5})\b")


@pytest.fixture
def slack_on(settings):
    settings.SAFESTOP_SLACK_SIGNING_SECRET = SECRET


def _approval(team, *, tool: str = "payments.charge", title: str = "Pay vendors") -> Approval:
    run = new_run(team, agent="billing-bot", title=title)
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="charge_1",
        tool=tool,
        side_effect="write",
        arguments={"amount": 120},
        actor=AGENT,
        needs_approval=True,
    )
    return Approval.objects.get(run=run)


def _signed_post(raw: bytes):
    stamp = str(int(time.time()))
    signature = SignatureVerifier(SECRET).generate_signature(timestamp=stamp, body=raw)
    return Client().post(
        URL,
        raw,
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=stamp,
        HTTP_X_SLACK_SIGNATURE=signature,
    )


def _click(approval: Approval, member: str, response_url: str = "", action: str = "approve"):
    payload = {
        "type": "block_actions",
        "user": {"id": member},
        "actions": [{"action_id": action, "value": approval.public_id}],
        "response_url": response_url,
    }
    return _signed_post(urlencode({"payload": json.dumps(payload)}).encode())


def _logged_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


# --------------------------------------------------------------------------------------------
# linking with proof


def test_a_viewer_cannot_claim_someone_elses_slack_member(team, bob, charlie, slack_on, receiver):
    approval = _approval(team)
    # The viewer types the boss's member id on their own page: nothing is linked.
    as_charlie = _logged_in(charlie)
    as_charlie.post("/notifications/subscriptions/slack/", {"slack_user_id": "U0BOSS"})
    assert not SlackLink.objects.exists()

    # The boss (bob, a reviewer) clicks Approve: nothing is decided, and Slack shows bob alone a
    # one-time code.
    assert _click(approval, "U0BOSS", receiver.url("/reply")).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING
    reply = json.loads(receiver.hits[-1].body)
    assert reply["response_type"] == "ephemeral" and "not linked" in reply["text"]
    [code] = CODE.findall(reply["text"])

    # A guess from the viewer links nothing; bob's own typing of the code does.
    response = as_charlie.post("/notifications/subscriptions/slack/", {"code": "ABCDE-FGHJK"})
    assert response.status_code == 302 and not SlackLink.objects.exists()
    _logged_in(bob).post("/notifications/subscriptions/slack/", {"code": code.lower()})
    assert SlackLink.objects.get().user == bob
    assert LedgerEntry.objects.filter(action="slack.linked").count() == 1

    # The code is used up: the viewer who sees it later gets nothing.
    as_charlie.post("/notifications/subscriptions/slack/", {"code": code})
    assert SlackLink.objects.get().user == bob

    assert _click(approval, "U0BOSS").status_code == 200
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == "bob"


def test_a_code_expires_and_only_the_newest_one_works(bob):
    first = slack_link_code_issue(slack_user_id="U0BOB")
    second = slack_link_code_issue(slack_user_id="U0BOB")
    with pytest.raises(InvalidInput, match="wrong or has expired"):
        slack_link_confirm(user=bob, code=first)
    SlackLinkCode.objects.update(expires_at=timezone.now() - timedelta(seconds=1))
    with pytest.raises(InvalidInput, match="wrong or has expired"):
        slack_link_confirm(user=bob, code=second)
    assert not SlackLink.objects.exists()


def test_an_admin_of_the_users_team_unlinks_a_slack_member(
    team, alice, bob, charlie, outsider, slack_on
):
    link = slack_link_confirm(user=bob, code=slack_link_code_issue(slack_user_id="U0BOB"))
    unlink = f"/notifications/slack-links/{link.pk}/unlink/"
    assert "U0BOB" in _logged_in(alice).get("/notifications/").content.decode()
    assert _logged_in(charlie).post(unlink).status_code == 403
    assert _logged_in(outsider).post(unlink).status_code == 403
    assert SlackLink.objects.exists()
    assert _logged_in(alice).post(unlink).status_code == 302
    assert not SlackLink.objects.exists()
    entry = LedgerEntry.objects.get(action="slack.unlinked")
    assert entry.actor == "alice" and entry.payload["slack_user_id"] == "U0BOB"


def test_a_user_unlinks_their_own_slack_member(bob, slack_on):
    slack_link_confirm(user=bob, code=slack_link_code_issue(slack_user_id="U0BOB"))
    client = _logged_in(bob)
    assert "U0BOB" in client.get("/notifications/subscriptions/").content.decode()
    client.post("/notifications/subscriptions/slack/", {"unlink": "1"})
    assert not SlackLink.objects.exists()


# --------------------------------------------------------------------------------------------
# malformed payloads with a valid signature


@pytest.mark.parametrize(
    "raw",
    [
        b"payload=not-json",
        b"nothing=here",
        urlencode({"payload": "[1, 2]"}).encode(),
        urlencode({"payload": json.dumps({"actions": "approve", "user": {"id": "U0BOB"}})}),
        urlencode({"payload": json.dumps({"actions": ["approve"], "user": {"id": "U0BOB"}})}),
        urlencode({"payload": json.dumps({"actions": [{"action_id": "approve"}], "user": "U0"})}),
        urlencode(
            {"payload": json.dumps({"actions": [{"action_id": ["approve"]}], "user": {"id": "U"}})}
        ),
        urlencode(
            {
                "payload": json.dumps(
                    {"actions": [{"action_id": "approve", "value": 7}], "user": {"id": "U0BOB"}}
                )
            }
        ),
        urlencode({"payload": "[" * 100_000 + "]" * 100_000}),
    ],
    ids=[
        "not-json",
        "no-payload",
        "a-list",
        "actions-a-string",
        "action-a-string",
        "user-a-string",
        "action-id-a-list",
        "value-a-number",
        "nested-too-deep",
    ],
)
def test_a_signed_but_malformed_payload_is_a_400(team, slack_on, raw):
    approval = _approval(team)
    body = raw if isinstance(raw, bytes) else raw.encode()
    assert _signed_post(body).status_code == 400
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING


def test_a_body_that_is_not_utf8_cannot_be_signed_and_is_a_401(team, slack_on):
    stamp = str(int(time.time()))
    response = Client().post(
        URL,
        b"\xff\xfe\x00",
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=stamp,
        HTTP_X_SLACK_SIGNATURE="v0=" + "0" * 64,
    )
    assert response.status_code == 401


# --------------------------------------------------------------------------------------------
# agent-supplied strings are inert in Slack's mrkdwn

HOSTILE = "<!channel> <https://evil.test|Approve here> & co"


def test_a_hostile_run_title_reaches_slack_escaped(team, receiver, make_channel):
    make_channel(team, receiver.url("/services/T0/B0/x"), kind="slack")
    stopped_dirty(team, title=HOSTILE)
    assert notify.deliveries_send_due(limit=5, sender="t") == 1
    body = json.loads(receiver.hits[0].body)
    mrkdwn = [body["text"]]
    for block in body["blocks"]:
        if block["type"] == "section":
            mrkdwn.append(block.get("text", {}).get("text", ""))
            mrkdwn += [field["text"] for field in block.get("fields", [])]
    joined = "\n".join(mrkdwn)
    assert "&lt;!channel&gt;" in body["text"]
    assert "<!channel>" not in joined and "<https://evil.test" not in joined
    assert "&amp; co" in joined


def test_the_decision_reply_escapes_the_agents_tool_name(team, bob, slack_on, receiver):
    approval = _approval(team, tool="<!channel>")
    slack_link_confirm(user=bob, code=slack_link_code_issue(slack_user_id="U0BOB"))
    assert _click(approval, "U0BOB", receiver.url("/reply")).status_code == 200
    reply = json.loads(receiver.hits[-1].body)
    assert "<!channel>" not in reply["text"] and "&lt;!channel&gt;" in reply["text"]
    assert "<!channel>" not in reply["blocks"][0]["text"]["text"]
