"""Slack interactivity: Approve / Reject buttons on approval messages (DESIGN §11).

On when `SAFESTOP_SLACK_SIGNING_SECRET` is set. `slack_action_handle` is what the endpoint
(`/integrations/slack/actions/`) calls:

1. verify the request's signature and its timestamp (±5 minutes) with `slack_sdk.signature`;
   refuse a replay of a correctly signed request (its signature was seen before);
2. read the payload; one Slack never sends (valid signature, malformed body) is a 400;
3. map the Slack member to the console user linked to that member id. A member nobody linked
   gets, in an ephemeral reply only that member sees, a one-time code to type on their own
   console page (`slack_link_confirm`): the link is made only with that proof, so nobody can
   claim another person's member id and have that person's clicks decided with their rights;
4. decide through `runs.services.approval_decide` with that user's rights (a reviewer of the
   approval's team); anyone else gets an ephemeral refusal and nothing changes;
5. answer Slack's `response_url` after the decision committed: the message is replaced by the
   outcome and who decided.

Anything refused at step 1 changes nothing and is answered 401. Every text sent back to Slack
is escaped for mrkdwn (`slack_escape`): an approval's subject is the agent's words.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

import httpx
from django.conf import settings
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone, translation
from django.utils.translation import gettext
from slack_sdk.signature import SignatureVerifier

from notifications.models import SlackLink, SlackLinkCode, SlackRequestSeen
from notifications.transports import slack_escape
from runs import services
from runs.access import Capability, Grants, is_admin_of_every_team, membership_roles
from runs.actors import Actor
from runs.errors import DomainError, InvalidInput, NotFound
from runs.ledger import ledger_append
from runs.models import Approval
from runs.services import validate_outbox_destination

logger = logging.getLogger(__name__)

REPLAY_WINDOW = timedelta(minutes=10)  # longer than the ±5 minutes a timestamp is accepted
LINK_CODE_LIFETIME = timedelta(minutes=10)
# Slack member ids: U… or W… followed by upper-case letters and digits.
SLACK_MEMBER_ID = re.compile(r"[UW][A-Z0-9]{1,31}")
# No 0/O or 1/I/L: a code is read off one screen and typed on another.
_CODE_ALPHABET = "ABCDEFGHJKMNPQRSTUVWXYZ23456789"
_CODE_LENGTH = 10  # 31^10 ≈ 8·10^14 codes, each alive ten minutes


@dataclass(frozen=True)
class SlackAnswer:
    status: int  # what the endpoint answers Slack (401: refused, nothing changed)
    response_url: str = ""
    reply: dict[str, Any] | None = None  # posted to response_url


@dataclass(frozen=True)
class SlackAction:
    """The parts of a `block_actions` payload this endpoint reads, type-checked."""

    action_id: str
    value: str
    slack_user: str
    response_url: str


# --------------------------------------------------------------------------------------------
# linking a Slack member to a console user, with proof


def _code_digest(code: str) -> str:
    normalised = "".join(char for char in code.upper() if char.isalnum())
    return hashlib.sha256(normalised.encode()).hexdigest()


def slack_link_code_issue(*, slack_user_id: str) -> str:
    """A new one-time code for this Slack member (any earlier one stops working). Only call it
    for a member id taken from a request Slack signed, and show the code to that member only."""
    if not SLACK_MEMBER_ID.fullmatch(slack_user_id):
        raise InvalidInput(gettext("not a Slack member id"), field="slack_user_id")
    code = "".join(secrets.choice(_CODE_ALPHABET) for _ in range(_CODE_LENGTH))
    now = timezone.now()
    with transaction.atomic():
        SlackLinkCode.objects.filter(expires_at__lt=now).delete()
        SlackLinkCode.objects.update_or_create(
            slack_user_id=slack_user_id,
            defaults={"code_hash": _code_digest(code), "expires_at": now + LINK_CODE_LIFETIME},
        )
    return f"{code[:5]}-{code[5:]}"


def slack_link_confirm(*, user: Any, code: str) -> SlackLink:
    """Link the Slack member a code was given to with `user`, who typed it: the code is the
    proof that `user` controls that member. The code is used up. A member linked to another
    account before moves to this one (the same person proved control again)."""
    digest = _code_digest(code)
    with transaction.atomic(durable=True):
        issued = (
            SlackLinkCode.objects.select_for_update()
            .filter(code_hash=digest, expires_at__gte=timezone.now())
            .first()
        )
        if issued is None:
            raise InvalidInput(
                gettext(
                    "that code is wrong or has expired: click Approve or Reject in Slack again "
                    "for a new one"
                ),
                field="code",
            )
        slack_user_id = issued.slack_user_id
        issued.delete()
        SlackLink.objects.filter(slack_user_id=slack_user_id).exclude(user=user).delete()
        link, _ = SlackLink.objects.update_or_create(
            user=user, defaults={"slack_user_id": slack_user_id}
        )
        ledger_append(
            run=None,
            actor=Actor.for_user(user),
            action="slack.linked",
            payload={"user": user.get_username(), "slack_user_id": slack_user_id},
        )
    return link


def slack_link_remove(*, user_id: int, actor: Actor) -> bool:
    """Unlink a user's Slack member: by the user, or by an admin (the view checks who may).
    False when there was no link."""
    with transaction.atomic(durable=True):
        link = (
            SlackLink.objects.select_for_update()
            .select_related("user")
            .filter(user_id=user_id)
            .first()
        )
        if link is None:
            return False
        ledger_append(
            run=None,
            actor=actor,
            action="slack.unlinked",
            payload={"user": link.user.get_username(), "slack_user_id": link.slack_user_id},
        )
        link.delete()
    return True


def slack_link_get(*, link_id: int) -> SlackLink:
    link = SlackLink.objects.select_related("user").filter(pk=link_id).first()
    if link is None:
        raise NotFound(gettext("no Slack link %(link_id)s") % {"link_id": link_id})
    return link


# --------------------------------------------------------------------------------------------
# the actions endpoint


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
    return {"response_type": "ephemeral", "replace_original": False, "text": slack_escape(text)}


def _parse(body: bytes) -> SlackAction | None:
    """The action in a signed request's body, or None when it is not one Slack would send."""
    try:
        payload = json.loads(parse_qs(body.decode("utf-8"))["payload"][0])
    except (KeyError, IndexError, ValueError, RecursionError):
        # ValueError covers bad UTF-8 and bad JSON; RecursionError, JSON nested too deep.
        return None
    if not isinstance(payload, dict):
        return None
    actions, user = payload.get("actions"), payload.get("user")
    if not (isinstance(actions, list) and actions and isinstance(actions[0], dict)):
        return None
    if not isinstance(user, dict):
        return None
    action_id = actions[0].get("action_id", "")
    value = actions[0].get("value", "")
    slack_user = user.get("id")
    response_url = payload.get("response_url", "")
    parts = (action_id, value, slack_user, response_url)
    if not all(isinstance(part, str) for part in parts):
        return None
    assert isinstance(slack_user, str)
    if not SLACK_MEMBER_ID.fullmatch(slack_user) or len(value) > 200 or len(response_url) > 2000:
        return None
    return SlackAction(str(action_id), str(value), slack_user, str(response_url))


def _link_offer(slack_user: str) -> str:
    code = slack_link_code_issue(slack_user_id=slack_user)
    page = settings.SAFESTOP_PUBLIC_URL.rstrip("/") + reverse("console:notification_subscriptions")
    minutes = int(LINK_CODE_LIFETIME.total_seconds() // 60)
    return gettext(
        "Your Slack account is not linked to safestop, so nothing was decided. To link it, sign in at %(page)s and enter the code %(code)s under Slack (valid %(minutes)s minutes, once). Then click again."
    ) % {"page": page, "code": code, "minutes": minutes}


def slack_action_handle(*, body: bytes, headers: dict[str, str]) -> SlackAnswer:
    lowered = {key.lower(): value for key, value in headers.items()}
    if not _verified(body, lowered):
        return SlackAnswer(401)
    if not _first_time(lowered.get("x-slack-signature", "")):
        return SlackAnswer(401)
    action = _parse(body)
    if action is None:
        return SlackAnswer(400)
    response_url = action.response_url
    decision = {"approve": "approve", "reject": "reject"}.get(action.action_id)
    if decision is None:
        return SlackAnswer(200)  # the link button: Slack just opened the page
    try:
        approval_id = services.parse_approval_id(action.value)
    except DomainError:
        return SlackAnswer(200, response_url, _ephemeral(gettext("That approval does not exist.")))
    approval = Approval.objects.filter(pk=approval_id).select_related("team").first()
    if approval is None:
        return SlackAnswer(200, response_url, _ephemeral(gettext("That approval does not exist.")))
    link = SlackLink.objects.filter(slack_user_id=action.slack_user).select_related("user").first()
    user = link.user if link is not None and link.user.is_active else None
    if user is None:
        # Slack signed this request for this member, and only this member sees an ephemeral
        # reply: the code in it proves control of the member id to whoever types it.
        return SlackAnswer(200, response_url, _ephemeral(_link_offer(action.slack_user)))
    # The clicker reads the answer in their own console language.
    with translation.override(_language_of(user)):
        return _decide(approval, user, decision, response_url)


def _language_of(user: Any) -> str:
    chosen = getattr(getattr(user, "console_settings", None), "language", "")
    return chosen or settings.LANGUAGE_CODE


def _decide(approval: Approval, user: Any, decision: str, response_url: str) -> SlackAnswer:
    grants = Grants.for_roles(
        membership_roles(user_id=user.pk), every_team=is_admin_of_every_team(user)
    )
    if not grants.may(Capability.REVIEW, approval.team_id):
        return SlackAnswer(
            200,
            response_url,
            _ephemeral(
                gettext(
                    "You may not decide approvals of team %(slug)s: that needs a reviewer. Nothing was changed."
                )
                % {"slug": approval.team.slug}
            ),
        )
    try:
        decided = services.approval_decide(
            approval_id=approval.pk,
            decision=decision,
            actor=Actor.for_user(user),
            message=gettext("decided in Slack by %(get_username)s")
            % {"get_username": user.get_username()},
        )
    except DomainError as exc:
        return SlackAnswer(
            200,
            response_url,
            _ephemeral(gettext("Not decided: %(detail)s") % {"detail": exc.detail}),
        )
    return SlackAnswer(200, response_url, _outcome(decided, user.get_username()))


def _outcome(approval: Approval, who: str) -> dict[str, Any]:
    words = {
        "who": who,
        "subject": approval.subject,
        "id": approval.public_id,
    }
    text = slack_escape(
        gettext("Approved by %(who)s: %(subject)s (%(id)s)") % words
        if approval.status == "approved"
        else gettext("Rejected by %(who)s: %(subject)s (%(id)s)") % words
    )
    return {
        "replace_original": True,
        "text": text,
        "blocks": [{"type": "section", "text": {"type": "mrkdwn", "text": text}}],
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
