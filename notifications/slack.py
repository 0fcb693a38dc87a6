"""Slack interactivity: Approve / Reject buttons on approval messages (DESIGN §11).

On when `SAFESTOP_SLACK_SIGNING_SECRET` is set. `slack_action_handle` is what the endpoint
(`/integrations/slack/actions/`) calls:

1. verify the request's signature and its timestamp (±5 minutes) with `slack_sdk.signature`;
   refuse a replay of a correctly signed request (its signature was seen before);
2. map the Slack member to the console user who linked that member id on their own page;
3. decide through `runs.services.approval_decide` with that user's rights (a reviewer of the
   approval's team); anyone else gets an ephemeral refusal and nothing changes;
4. answer Slack's `response_url` after the decision committed: the message is replaced by the
   outcome and who decided.

Anything refused at step 1 changes nothing and is answered 401.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone
from slack_sdk.signature import SignatureVerifier

from notifications.models import SlackLink, SlackRequestSeen
from notifications.transports import slack_escape
from runs import services
from runs.access import Capability, Grants, is_admin_of_every_team, membership_roles
from runs.actors import Actor
from runs.errors import DomainError, InvalidInput
from runs.models import Approval
from runs.services import validate_outbox_destination

logger = logging.getLogger(__name__)

REPLAY_WINDOW = timedelta(minutes=10)  # longer than the ±5 minutes a timestamp is accepted


@dataclass(frozen=True)
class SlackAnswer:
    status: int  # what the endpoint answers Slack (401: refused, nothing changed)
    response_url: str = ""
    reply: dict[str, Any] | None = None  # posted to response_url


def slack_link_set(*, user: Any, slack_user_id: str) -> SlackLink | None:
    """The user's own Slack member id (blank removes it)."""
    slack_user_id = slack_user_id.strip()
    with transaction.atomic(durable=True):
        if not slack_user_id:
            SlackLink.objects.filter(user=user).delete()
            return None
        if not slack_user_id.isalnum() or len(slack_user_id) > 32:
            raise InvalidInput("a Slack member id looks like U012AB3CD", field="slack_user_id")
        taken = SlackLink.objects.filter(slack_user_id=slack_user_id).exclude(user=user).exists()
        if taken:
            raise InvalidInput(
                "that Slack member is linked to another account", field="slack_user_id"
            )
        link, _ = SlackLink.objects.update_or_create(
            user=user, defaults={"slack_user_id": slack_user_id}
        )
    return link


def _verified(body: bytes, headers: dict[str, str]) -> bool:
    secret = settings.SAFESTOP_SLACK_SIGNING_SECRET
    if not secret:
        return False
    try:
        return SignatureVerifier(secret).is_valid_request(body, headers)
    except ValueError:  # a timestamp that is not a number
        return False


def _first_time(signature: str) -> bool:
    """Record the signature; False if it was seen before (a replay)."""
    SlackRequestSeen.objects.filter(seen_at__lt=timezone.now() - REPLAY_WINDOW).delete()
    try:
        with transaction.atomic():
            SlackRequestSeen.objects.create(signature=signature[:100])
    except IntegrityError:
        return False
    return True


def _ephemeral(text: str) -> dict[str, Any]:
    return {"response_type": "ephemeral", "replace_original": False, "text": text}


def slack_action_handle(*, body: bytes, headers: dict[str, str]) -> SlackAnswer:
    lowered = {key.lower(): value for key, value in headers.items()}
    if not _verified(body, lowered):
        return SlackAnswer(401)
    if not _first_time(lowered.get("x-slack-signature", "")):
        return SlackAnswer(401)
    try:
        payload = json.loads(parse_qs(body.decode())["payload"][0])
        action = payload["actions"][0]
        slack_user = str(payload["user"]["id"])
        response_url = str(payload.get("response_url", ""))
    except (KeyError, IndexError, ValueError, TypeError):
        return SlackAnswer(400)
    decision = {"approve": "approve", "reject": "reject"}.get(str(action.get("action_id")))
    if decision is None:
        return SlackAnswer(200)  # the link button: Slack just opened the page
    try:
        approval_id = services.parse_approval_id(str(action.get("value", "")))
    except DomainError:
        return SlackAnswer(200, response_url, _ephemeral("That approval does not exist."))
    approval = Approval.objects.filter(pk=approval_id).select_related("team").first()
    link = SlackLink.objects.filter(slack_user_id=slack_user).select_related("user").first()
    user = link.user if link is not None and link.user.is_active else None
    if approval is None or user is None:
        why = (
            "That approval does not exist."
            if approval is None
            else "Link your Slack account on your safestop page (My subscriptions) first."
        )
        return SlackAnswer(200, response_url, _ephemeral(why))
    grants = Grants.for_roles(
        membership_roles(user_id=user.pk), every_team=is_admin_of_every_team(user)
    )
    if not grants.may(Capability.REVIEW, approval.team_id):
        return SlackAnswer(
            200,
            response_url,
            _ephemeral(
                f"You may not decide approvals of team {approval.team.slug}: "
                "that needs a reviewer. Nothing was changed."
            ),
        )
    try:
        decided = services.approval_decide(
            approval_id=approval.pk,
            decision=decision,
            actor=Actor.for_user(user),
            message=f"decided in Slack by {user.get_username()}",
        )
    except DomainError as exc:
        return SlackAnswer(200, response_url, _ephemeral(f"Not decided: {exc.detail}"))
    return SlackAnswer(200, response_url, _outcome(decided, user.get_username()))


def _outcome(approval: Approval, who: str) -> dict[str, Any]:
    verb = "Approved" if approval.status == "approved" else "Rejected"
    text = f"{verb} by {who}: {approval.subject} ({approval.public_id})"
    return {
        "replace_original": True,
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": slack_escape(text)}}],
    }


def slack_reply(answer: SlackAnswer) -> None:
    """Post the reply to Slack's response_url: after the decision committed, with timeouts,
    only to an allowed host (`hooks.slack.com` in production), never redirected."""
    if not (answer.reply and answer.response_url):
        return
    try:
        validate_outbox_destination("webhook", answer.response_url)
    except InvalidInput:
        logger.warning("Slack response_url is not on SAFESTOP_WEBHOOK_ALLOWED_HOSTS")
        return
    try:
        with httpx.Client(timeout=2.0, follow_redirects=False, trust_env=False) as client:
            client.post(answer.response_url, json=answer.reply)
    except httpx.HTTPError as exc:
        logger.warning("Slack response_url did not answer: %s", type(exc).__name__)
