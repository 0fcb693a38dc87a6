"""Notifications (DESIGN §11): a team's channels (admins), what was delivered (admins), the
demo's outbox of captured mail (admins), and everyone's own email subscriptions.

A channel's signing secret is rendered once, in the answer to the POST that created it, and
never again; Slack and Apprise targets (their URL is their credential) are shown masked.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.translation import gettext
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_http_methods, require_POST

from console.access import request_access, visible_teams
from console.views.common import (
    FilterError,
    HtmxHttpRequest,
    act,
    actor_of,
    error_text,
    page,
    redirect_with,
)
from notifications import selectors
from notifications import services as notify
from notifications.forms import ChannelEditForm, ChannelForm, SubscriptionForm
from notifications.models import (
    ALL_EVENTS,
    TEST_EVENT,
    Delivery,
    DeliveryStatus,
    Event,
    NotificationChannel,
)
from notifications.slack import (
    slack_action_handle,
    slack_link_confirm,
    slack_link_get,
    slack_link_remove,
    slack_reply,
)
from notifications.transports import Answer
from runs.access import membership_roles
from runs.errors import DomainError, InvalidInput, NotFound
from runs.models import Team

CHANNELS = "notifications/channels.html"
CHANNEL = "notifications/channel.html"
DELIVERIES = "notifications/deliveries.html"
SUBSCRIPTIONS = "notifications/subscriptions.html"
OUTBOX = "notifications/outbox.html"
CAPTURE_BACKEND = "notifications.mail.CaptureEmailBackend"


def _admin_teams(request: HtmxHttpRequest) -> list[Team]:
    access = request_access(request)
    if not access.is_admin_anywhere:
        raise PermissionDenied(gettext("notification channels are managed by team admins"))
    return [team for team in visible_teams(access) if access.can_admin(team.pk)]


def _channel_for(request: HtmxHttpRequest, channel_id: int) -> NotificationChannel:
    channel = selectors.channel_get(channel_id=channel_id)
    access = request_access(request)
    if channel is None or not access.can_view(channel.team_id):
        raise Http404(gettext("no such channel"))
    if not access.can_admin(channel.team_id):
        raise PermissionDenied(
            gettext("channels of team %(slug)s are managed by its admins")
            % {"slug": channel.team.slug}
        )
    return channel


def _field_error(form: Any, error: DomainError) -> str:
    """A refusal about one field (a target off the allow-list) is shown at that field; any
    other is the form's message (returned)."""
    field = error.extra.get("field") if isinstance(error, InvalidInput) else None
    if isinstance(field, str) and field in form.fields:
        form.add_error(field, error_text(error))
        return ""
    return error_text(error)


def _common(**extra: Any) -> dict[str, Any]:
    return {
        "event_choices": Event.choices,
        "capturing": settings.EMAIL_BACKEND == CAPTURE_BACKEND,
        **extra,
    }


def _channels_context(teams: list[Team], form: ChannelForm, **extra: Any) -> dict[str, Any]:
    return _common(
        teams=teams,
        form=form,
        channels=selectors.channels_of(teams=teams),
        slack_links=selectors.slack_links_of(teams=teams),
        **extra,
    )


@login_required
@require_http_methods(["GET", "POST"])
def channels(request: HtmxHttpRequest) -> HttpResponse:
    if not request_access(request).is_admin_anywhere:
        # Everyone else manages only their own subscriptions.
        return HttpResponseRedirect(reverse("console:notification_subscriptions"))
    teams = _admin_teams(request)
    choices = [(team.slug, team.slug) for team in teams]
    if request.method != "POST":
        form = ChannelForm(teams=choices, initial={"events": ALL_EVENTS})
        return page(request, CHANNELS, _channels_context(teams, form, **_tested(request, teams)))
    form = ChannelForm(request.POST, teams=choices)
    if not form.is_valid():
        return page(request, CHANNELS, _channels_context(teams, form), status=400)
    data = form.cleaned_data
    team = next(team for team in teams if team.slug == data["team"])
    try:
        created = notify.channel_create(
            team=team,
            name=data["name"],
            kind=data["kind"],
            target=data["target"],
            events=data["events"],
            agent_glob=data["agent_glob"],
            language=data["language"],
            actor=actor_of(request),
        )
    except DomainError as exc:
        return page(
            request,
            CHANNELS,
            _channels_context(teams, form, create_error=_field_error(form, exc)),
            status=400,
        )
    # The secret exists in this response only: rendered once, never redirected or stored
    # anywhere the page could show it again.
    fresh = ChannelForm(teams=choices, initial={"events": ALL_EVENTS})
    return page(
        request,
        CHANNELS,
        _channels_context(teams, fresh, new_channel=created.channel, new_secret=created.secret),
    )


@login_required
@require_http_methods(["GET", "POST"])
def channel_edit(request: HtmxHttpRequest, channel_id: int) -> HttpResponse:
    channel = _channel_for(request, channel_id)
    if request.method != "POST":
        form = ChannelEditForm(
            initial={
                "name": channel.name,
                "events": channel.events,
                "agent_glob": channel.agent_glob,
                "enabled": channel.enabled,
                # Only an email address is shown back; URLs may carry a token.
                "target": channel.target if channel.kind == "email" else "",
            }
        )
        return page(request, CHANNEL, _common(channel=channel, form=form))
    form = ChannelEditForm(request.POST)
    error = ""
    if form.is_valid():
        data = form.cleaned_data
        try:
            notify.channel_update(
                channel_id=channel.pk,
                actor=actor_of(request),
                name=data["name"],
                target=data["target"],
                events=data["events"],
                agent_glob=data["agent_glob"],
                enabled=data["enabled"],
                language=data["language"],
            )
        except DomainError as exc:
            error = _field_error(form, exc)
        else:
            return redirect_with(
                request,
                reverse("console:notifications"),
                ok=gettext("Channel %(repr)s saved.") % {"repr": repr(data["name"])},
            )
    return page(request, CHANNEL, _common(channel=channel, form=form, edit_error=error), status=400)


@login_required
@require_POST
def channel_delete(request: HtmxHttpRequest, channel_id: int) -> HttpResponse:
    channel = _channel_for(request, channel_id)

    def delete(_data: dict[str, Any]) -> str:
        notify.channel_delete(channel_id=channel.pk, actor=actor_of(request))
        return gettext("Channel %(repr)s deleted.") % {"repr": repr(channel.name)}

    return act(
        request, form=None, service=delete, back=reverse("console:notifications"), fragment=None
    )


@login_required
@require_POST
def channel_test(request: HtmxHttpRequest, channel_id: int) -> HttpResponse:
    """Deliver a sample now, then redirect to the channels page, which shows what the target
    answered (read back from the test's delivery): a reload shows it again, never re-sends."""
    channel = _channel_for(request, channel_id)
    delivery, _answer = notify.channel_send_test(channel_id=channel.pk, actor=actor_of(request))
    return HttpResponseRedirect(f"{reverse('console:notifications')}?tested={delivery.pk}")


def _tested(request: HtmxHttpRequest, teams: list[Team]) -> dict[str, Any]:
    """The answer of a "Send test" the channels page was redirected with (`?tested=<delivery>`),
    if that test went to a channel of a team the user administers."""
    raw = request.GET.get("tested", "")
    if not raw.isdigit():
        return {}
    delivery = (
        Delivery.objects.select_related("channel")
        .filter(pk=int(raw), event=TEST_EVENT, team__in=teams, channel__isnull=False)
        .first()
    )
    if delivery is None:
        return {}
    answer = Answer(
        ok=delivery.status == DeliveryStatus.SENT,
        status=delivery.response_status,
        excerpt=delivery.response_excerpt,
        error=delivery.last_error,
    )
    return {"tested": delivery.channel, "test_delivery": delivery, "answer": answer}


@login_required
def deliveries(request: HtmxHttpRequest) -> HttpResponse:
    teams = _admin_teams(request)
    status = request.GET.get("status", "")
    errors: list[FilterError] = []
    if status and status not in DeliveryStatus.values:
        # An unreadable filter shows nothing and says why; it never widens to every delivery.
        errors = [
            FilterError(
                "status",
                gettext("Status"),
                gettext("%(value)s is not a delivery status.") % {"value": status[:40]},
            )
        ]
    rows = [] if errors else selectors.deliveries_of(teams=teams, status=status)
    return page(
        request,
        DELIVERIES,
        _common(rows=rows, status=status, statuses=DeliveryStatus.values, filter_errors=errors),
    )


@login_required
def outbox(request: HtmxHttpRequest) -> HttpResponse:
    """The demo's "Outbox of notifications": mail the capture backend kept instead of sending."""
    _admin_teams(request)
    notices, agents = selectors.captured_mails_by_sender()
    return page(request, OUTBOX, _common(mails=notices, agent_mails=agents))


@login_required
@require_http_methods(["GET", "POST"])
def subscriptions(request: HtmxHttpRequest) -> HttpResponse:
    access = request_access(request)
    teams = visible_teams(access)
    choices = [(team.slug, team.slug) for team in teams]
    if request.method == "POST":
        form = SubscriptionForm(request.POST, teams=choices)
        if not form.is_valid():
            return redirect_with(
                request,
                reverse("console:notification_subscriptions"),
                error=gettext("invalid input"),
            )
        team = next(team for team in teams if team.slug == form.cleaned_data["team"])
        if form.cleaned_data["events"] and not request.user.email:  # type: ignore[union-attr]
            return redirect_with(
                request,
                reverse("console:notification_subscriptions"),
                error=InvalidInput(gettext("your account has no email address to send to")),
            )
        notify.subscription_set(
            user=request.user,
            team=team,
            events=form.cleaned_data["events"],
            agent_glob=form.cleaned_data["agent_glob"],
        )
        return redirect_with(
            request,
            reverse("console:notification_subscriptions"),
            ok=gettext("Subscriptions for %(slug)s saved.") % {"slug": team.slug},
        )
    mine = selectors.subscriptions_of(user_id=request.user.pk)  # type: ignore[arg-type]
    rows = [{"team": team, "subscription": mine.get(team.pk)} for team in teams]
    link = selectors.slack_link_of(user_id=request.user.pk)  # type: ignore[arg-type]
    return page(
        request,
        SUBSCRIPTIONS,
        _common(rows=rows, slack_link=link, slack_on=bool(settings.SAFESTOP_SLACK_SIGNING_SECRET)),
    )


@login_required
@require_POST
def slack_link(request: HtmxHttpRequest) -> HttpResponse:
    """Link the Slack member a one-time code was given to (in an ephemeral Slack reply, which
    only that member sees) with the signed-in user; or unlink the user's own member."""
    back = reverse("console:notification_subscriptions")
    if request.POST.get("unlink"):
        removed = slack_link_remove(
            user_id=request.user.pk,  # type: ignore[arg-type]
            actor=actor_of(request),
        )
        return redirect_with(
            request, back, ok=gettext("Slack account unlinked.") if removed else ""
        )
    try:
        link = slack_link_confirm(user=request.user, code=request.POST.get("code", ""))
    except DomainError as exc:
        return redirect_with(request, back, error=exc)
    return redirect_with(
        request,
        back,
        ok=gettext("Slack member %(member)s linked to your account.")
        % {"member": link.slack_user_id},
    )


@login_required
@require_POST
def slack_unlink(request: HtmxHttpRequest, link_id: int) -> HttpResponse:
    """An admin unlinks a Slack member from a user of one of their teams (a lost laptop, a
    person who left): that member's clicks decide nothing until it is linked again."""
    access = request_access(request)
    try:
        link = slack_link_get(link_id=link_id)
    except NotFound:
        raise Http404(gettext("no such Slack link")) from None
    teams = membership_roles(user_id=link.user_id)
    if not (access.all_teams or any(access.can_admin(team_id) for team_id in teams)):
        raise PermissionDenied(gettext("only an admin of one of the user's teams may unlink"))

    def unlink(_data: dict[str, Any]) -> str:
        slack_link_remove(user_id=link.user_id, actor=actor_of(request))
        return gettext("Slack member %(member)s unlinked from %(user)s.") % {
            "member": link.slack_user_id,
            "user": link.user.get_username(),
        }

    return act(
        request, form=None, service=unlink, back=reverse("console:notifications"), fragment=None
    )


@csrf_exempt  # Slack signs the request instead (verified before anything is read or changed)
@require_POST
def slack_actions(request: HtmxHttpRequest) -> HttpResponse:
    """Slack's Approve / Reject clicks (`notifications.slack`). 401 for anything unsigned,
    forged, stale or replayed; the decision itself is the approval service's."""
    if not settings.SAFESTOP_SLACK_SIGNING_SECRET:
        raise Http404(gettext("Slack interactivity is not configured"))
    answer = slack_action_handle(body=request.body, headers=dict(request.headers))
    slack_reply(answer)
    return HttpResponse(status=answer.status)
