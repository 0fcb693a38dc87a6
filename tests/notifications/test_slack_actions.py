"""Slack's Approve / Reject buttons (`/integrations/slack/actions/`), driven with correctly and
wrongly signed requests: only a verified, fresh, first-time request from a linked reviewer
decides, through the approval service; everything else changes nothing."""

from __future__ import annotations

import json
import time
from urllib.parse import urlencode

import pytest
from django.test import Client
from slack_sdk.signature import SignatureVerifier

from notifications import services as notify
from notifications.models import Delivery, SlackLink
from notifications.slack import slack_link_code_issue, slack_link_confirm
from runs import services
from runs.errors import InvalidInput
from runs.models import Approval, ApprovalStatus
from tests.support.scenarios import AGENT, new_run, start

pytestmark = pytest.mark.django_db

SECRET = "8f742231b10e8888abcd99yyyzzz85a5"
URL = "/integrations/slack/actions/"


@pytest.fixture
def slack_on(settings):
    settings.SAFESTOP_SLACK_SIGNING_SECRET = SECRET


@pytest.fixture
def approval(team, slack_on):
    run = new_run(team, agent="billing-bot")
    start(run)
    run.refresh_from_db()
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="charge_1",
        tool="payments.charge",
        side_effect="write",
        arguments={"amount": 120},
        actor=AGENT,
        needs_approval=True,
    )
    return Approval.objects.get(run=run)


def _link(user, member: str) -> None:
    """Link as a person does: the code Slack showed `member`, typed by `user`."""
    slack_link_confirm(user=user, code=slack_link_code_issue(slack_user_id=member))


def _body(approval, action="approve", user="U0BOB", response_url="") -> bytes:
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": "bob"},
        "actions": [{"action_id": action, "value": approval.public_id}],
        "response_url": response_url,
    }
    return urlencode({"payload": json.dumps(payload)}).encode()


def _post(body: bytes, *, secret: str = SECRET, timestamp: int | None = None, signature=None):
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    sig = signature or SignatureVerifier(secret).generate_signature(timestamp=stamp, body=body)
    return Client().post(
        URL,
        body,
        content_type="application/x-www-form-urlencoded",
        HTTP_X_SLACK_REQUEST_TIMESTAMP=stamp,
        HTTP_X_SLACK_SIGNATURE=sig,
    )


def test_a_linked_reviewer_approves_from_slack_and_the_message_says_who(approval, bob, receiver):
    _link(bob, "U0BOB")
    response = _post(_body(approval, response_url=receiver.url("/slack-response")))
    assert response.status_code == 200
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == "bob"
    reply = json.loads(receiver.hits[0].body)
    assert reply["replace_original"] is True
    assert reply["text"] == f"Approved by bob: payments.charge ({approval.public_id})"


def test_a_reject_goes_through_the_same_service(approval, bob):
    _link(bob, "U0BOB")
    assert _post(_body(approval, action="reject")).status_code == 200
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.REJECTED
    assert approval.message == "decided in Slack by bob"


def test_a_viewers_click_is_refused_with_an_ephemeral_reply(approval, charlie, receiver):
    _link(charlie, "U0CHARLIE")
    body = _body(approval, user="U0CHARLIE", response_url=receiver.url("/r"))
    assert _post(body).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING
    reply = json.loads(receiver.hits[0].body)
    assert reply["response_type"] == "ephemeral" and "needs a reviewer" in reply["text"]


def test_an_unlinked_slack_user_changes_nothing(approval, bob):
    assert _post(_body(approval, user="U0STRANGER")).status_code == 200
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING


@pytest.mark.parametrize(
    "tamper",
    ["wrong_secret", "stale", "future", "no_signature", "garbage_timestamp", "edited_body"],
)
def test_forged_or_stale_requests_get_401_and_change_nothing(approval, bob, tamper):
    _link(bob, "U0BOB")
    body = _body(approval)
    kwargs: dict = {}
    if tamper == "wrong_secret":
        kwargs["secret"] = "not-the-secret"
    elif tamper == "stale":
        kwargs["timestamp"] = int(time.time()) - 6 * 60
    elif tamper == "future":
        kwargs["timestamp"] = int(time.time()) + 6 * 60
    elif tamper == "no_signature":
        kwargs["signature"] = "v0=" + "0" * 64
    elif tamper == "garbage_timestamp":
        response = Client().post(
            URL,
            body,
            content_type="application/x-www-form-urlencoded",
            HTTP_X_SLACK_REQUEST_TIMESTAMP="soon",
            HTTP_X_SLACK_SIGNATURE="v0=abc",
        )
        assert response.status_code == 401
        assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING
        return
    elif tamper == "edited_body":
        stamp = str(int(time.time()))
        sig = SignatureVerifier(SECRET).generate_signature(timestamp=stamp, body=body)
        kwargs["signature"] = sig
        kwargs["timestamp"] = int(stamp)
        body = _body(approval, action="reject")
    assert _post(body, **kwargs).status_code == 401
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.WAITING


def test_a_replayed_request_gets_401(approval, bob):
    _link(bob, "U0BOB")
    body = _body(approval, action="reject")
    stamp = int(time.time())
    assert _post(body, timestamp=stamp).status_code == 200
    assert _post(body, timestamp=stamp).status_code == 401


def test_without_a_signing_secret_the_endpoint_does_not_exist(approval, settings):
    settings.SAFESTOP_SLACK_SIGNING_SECRET = ""
    assert _post(_body(approval)).status_code == 404


def test_approval_messages_carry_the_buttons_when_interactivity_is_on(
    team, receiver, make_channel, approval
):
    # The approval fixture's request came before the channel: ask again on a new call.
    make_channel(team, receiver.url("/services/T/B/x"), kind="slack")
    run = approval.run
    services.permit_request(
        run_id=run.pk,
        epoch=run.stop_epoch,
        tool_call_id="charge_2",
        tool="payments.charge",
        side_effect="write",
        actor=AGENT,
        needs_approval=True,
    )
    notify.deliveries_send_due(limit=5, sender="t")
    assert Delivery.objects.get().status == "sent"
    elements = json.loads(receiver.hits[0].body)["blocks"][-1]["elements"]
    assert [e["action_id"] for e in elements] == ["open_console", "approve", "reject"]
    assert elements[1]["value"].startswith("appr_")


def test_a_slack_member_is_linked_to_one_account_only(bob, alice):
    _link(bob, "U0BOB")
    _link(alice, "U0BOB")  # proved control again, from another account: the link moves
    assert SlackLink.objects.get(slack_user_id="U0BOB").user == alice
    with pytest.raises(InvalidInput):
        slack_link_code_issue(slack_user_id="U0 <script>")
