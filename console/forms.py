"""Console forms: they validate input and nothing else (writes happen in the services)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy

from handoff.models import ResolutionDecision
from runs.argument_schemas import MAX_JSON_DEPTH, json_too_deep
from runs.models import (
    ApprovalAppliesTo,
    ApprovalRisk,
    RunStatus,
    SideEffect,
    StopReason,
    TokenRole,
)
from runs.services import BulkFilter

# Reasons a person picks when pressing Stop. manual_takeover is the Take over button;
# budget_exhausted and timeout are the budget enforcer's (and an agent token's), lease_expired and
# drain_deadline the system's own: none is offered to a person. The server's rules are
# `runs.access.stop_reason_refusal`; this list is only what the console offers.
HUMAN_STOP_REASONS = [
    (StopReason.USER_STOP.value, "User stop"),
    (StopReason.DEPENDENCY_FAILURE.value, "Dependency failure"),
]
ADMIN_STOP_REASONS = [(StopReason.ADMIN_KILL.value, "Admin kill (admins only)")]


class StopForm(forms.Form):
    reason = forms.ChoiceField(choices=HUMAN_STOP_REASONS, initial=StopReason.USER_STOP)
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why, in a sentence. It goes into the stop packet and the ledger.",
    )

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if admin:
            self.fields["reason"].choices = [*HUMAN_STOP_REASONS, *ADMIN_STOP_REASONS]  # type: ignore[attr-defined]


class NoteForm(forms.Form):
    note = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )


class CloseNoteForm(forms.Form):
    """Closing ends a run for good: the reason is required (it goes to the ledger)."""

    note = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        error_messages={"required": "Say why the run is closed."},
    )


class HandoffAcceptForm(forms.Form):
    # Set when the person confirmed taking a handoff assigned to someone else.
    take_from_assignee = forms.BooleanField(required=False)


class HandoffFilterForm(forms.Form):
    """The handoff inbox: whose (`me`, `none`, a username, or everyone's) and in which order."""

    assignee = forms.CharField(required=False, max_length=150)
    sort = forms.ChoiceField(
        required=False, choices=[("oldest", "Oldest first"), ("newest", "Newest first")]
    )
    mine = forms.CharField(required=False, max_length=1)  # the "Handed to me" tab: assignee=me


class HandoffAssignForm(forms.Form):
    """`me`, a teammate's username, or empty for nobody."""

    assignee = forms.CharField(required=False, max_length=150)


class SteeringForm(forms.Form):
    text = forms.CharField(
        max_length=10_000, widget=forms.Textarea(attrs={"rows": 2}), label="Message to the agent"
    )


class SteeringDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("carry_over", "Carry over"), ("discard", "Discard")])


class ResumeForm(forms.Form):
    checkpoint = forms.ChoiceField(
        required=False, choices=[("", "Where it stopped (latest resume point)")]
    )
    carry_over_steering = forms.BooleanField(
        required=False,
        label="Carry over unapplied steering messages (otherwise they are discarded)",
    )
    note = forms.CharField(
        required=False, max_length=2000, widget=forms.Textarea(attrs={"rows": 2})
    )

    def __init__(self, *args: Any, checkpoints: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["checkpoint"].choices = [  # type: ignore[attr-defined]
            ("", "Where it stopped (latest resume point)"),
            *[(label, label) for label in checkpoints or []],
        ]


class ResolutionForm(forms.Form):
    target = forms.ChoiceField(
        choices=[("tool_call", "Tool call"), ("outbox", "Outbox item"), ("worker", "Worker")]
    )
    target_id = forms.CharField(max_length=120)
    decision = forms.ChoiceField(choices=ResolutionDecision.choices, widget=forms.RadioSelect)
    evidence = forms.CharField(
        max_length=5000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="How you know: a query result, a ticket, a log line.",
    )


class RunFilterForm(forms.Form):
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *RunStatus.choices])
    agent = forms.CharField(required=False, max_length=120)
    team = forms.CharField(required=False, max_length=64)
    q = forms.CharField(required=False, max_length=200, label="Search")
    after = forms.CharField(required=False, max_length=200)
    before = forms.CharField(required=False, max_length=200)
    sort = forms.ChoiceField(
        required=False,
        choices=[
            ("", gettext_lazy("Newest first")),
            ("cost", gettext_lazy("Cost, most first")),
            ("tokens", gettext_lazy("Tokens, most first")),
        ],
    )


def _aware(value: datetime | None) -> datetime | None:
    """In UTC, or a validation error: a filter value goes into a query, and PostgreSQL refuses
    a UTC offset past ±15:59 while Python cannot hold a moment before year 1 or after 9999."""
    if value is None:
        return None
    try:
        aware = timezone.make_aware(value) if timezone.is_naive(value) else value
        return aware.astimezone(UTC)
    except (OverflowError, ValueError):
        raise forms.ValidationError("This date is out of range.") from None


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=150)
    action = forms.CharField(required=False, max_length=60)
    reason = forms.CharField(required=False, max_length=60)
    team = forms.CharField(required=False, max_length=64)
    run = forms.CharField(required=False, max_length=32)
    since = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = forms.DateTimeField(
        required=False,
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    after = forms.IntegerField(required=False, min_value=1)

    def clean_since(self) -> datetime | None:
        return _aware(self.cleaned_data.get("since"))

    def clean_until(self) -> datetime | None:
        return _aware(self.cleaned_data.get("until"))


PERIODS = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
}


class QualityPeriodForm(forms.Form):
    period = forms.ChoiceField(
        required=False,
        initial="7d",
        choices=[
            ("24h", "Last 24 hours"),
            ("7d", "Last 7 days"),
            ("30d", "Last 30 days"),
            ("90d", "Last 90 days"),
            ("custom", "Custom"),
        ],
    )
    since = forms.DateField(required=False, widget=forms.DateInput(attrs={"type": "date"}))
    until = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}), help_text="inclusive"
    )
    team = forms.CharField(required=False, max_length=64)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if data.get("period") == "custom" or (since and until):
            if not since or not until:
                raise forms.ValidationError("A custom period needs both dates.")
            if since > until:
                raise forms.ValidationError("The start date is after the end date.")
            if until >= date.max:  # the window ends the day after `until`
                raise forms.ValidationError(f"The end date must be before {date.max}.")
        return data

    def window(self) -> tuple[datetime, datetime, str]:
        """The [since, until) window the figures cover, and its label."""
        data = self.cleaned_data if self.is_bound and self.is_valid() else {}
        since, until = data.get("since"), data.get("until")
        if since and until:
            tz = timezone.get_current_timezone()
            start = datetime.combine(since, time.min, tzinfo=tz)
            end = datetime.combine(until, time.min, tzinfo=tz) + timedelta(days=1)
            return start, end, f"{since:%Y-%m-%d} – {until:%Y-%m-%d}"
        period = data.get("period") or "7d"
        if period not in PERIODS:
            period = "7d"
        end = timezone.now()
        return end - PERIODS[period], end, dict(self.fields["period"].choices)[period]  # type: ignore[attr-defined]


class TokenCreateForm(forms.Form):
    team = forms.ChoiceField(choices=[])
    name = forms.CharField(max_length=120)
    role = forms.ChoiceField(choices=TokenRole.choices, initial=TokenRole.AGENT)

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams or []  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# approvals (DESIGN §10)

APPROVAL_TABS = [
    ("waiting", "Waiting"),
    ("approved", "Approved"),
    ("rejected", "Rejected"),
    ("expired", "Expired"),
    ("void", "Void"),
    ("all", "All"),
]


class ApprovalFilterForm(forms.Form):
    status = forms.ChoiceField(required=False, choices=APPROVAL_TABS)
    team = forms.CharField(required=False, max_length=64)
    agent = forms.CharField(required=False, max_length=120)
    tool = forms.CharField(required=False, max_length=200)
    risk = forms.ChoiceField(required=False, choices=[("", "Any risk"), *ApprovalRisk.choices])
    run = forms.CharField(required=False, max_length=32)


class ApprovalRuleForm(forms.Form):
    """Types and choices only: what a glob may hold, which transports exist and how the fields
    fit together are the service's checks (`runs.services.approval_rules`), shown on the form."""

    # Posted keys that are not fields: the CSRF token, and the team on the create form.
    ALLOWED_EXTRA = frozenset({"csrfmiddlewaretoken"})

    name = forms.CharField(max_length=120)
    enabled = forms.BooleanField(required=False, initial=True)
    position = forms.IntegerField(min_value=0, max_value=1_000_000, initial=100)
    applies_to = forms.ChoiceField(choices=ApprovalAppliesTo.choices, initial=ApprovalAppliesTo.ANY)
    tool_glob = forms.CharField(required=False, max_length=200, strip=False)
    side_effect = forms.ChoiceField(
        required=False, choices=[("", "Any call"), (SideEffect.WRITE.value, "Writes only")]
    )
    agent_glob = forms.CharField(required=False, max_length=200, strip=False)
    transport = forms.CharField(required=False, max_length=16)
    destination_glob = forms.CharField(required=False, max_length=500, strip=False)
    risk = forms.ChoiceField(choices=ApprovalRisk.choices, initial=ApprovalRisk.MEDIUM)
    timeout_seconds = forms.IntegerField(min_value=1, max_value=86_400, initial=900)
    escalate_after_seconds = forms.IntegerField(required=False, min_value=1, max_value=86_400)

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"] = forms.ChoiceField(choices=teams)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        unknown = sorted(set(self.data) - set(self.fields) - self.ALLOWED_EXTRA)
        if unknown:
            raise forms.ValidationError(f"unknown field: {', '.join(unknown)}")
        return data

    def rule_fields(self) -> dict[str, Any]:
        """The cleaned values, as the rule services take them."""
        return {name: self.cleaned_data[name] for name in self.fields if name != "team"}


class ApprovalDecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("reject", "Reject")])
    message = forms.CharField(required=False, max_length=4000)
    # The edited arguments, as JSON text; blank means "as they are".
    arguments = forms.CharField(required=False, max_length=200_000, strip=False)

    def clean_arguments(self) -> dict[str, Any] | None:
        text = self.cleaned_data.get("arguments") or ""
        if not text.strip():
            return None
        try:
            value = json.loads(text)
        except ValueError as error:
            raise forms.ValidationError(f"not valid JSON: {error}") from None
        except RecursionError:
            value = None  # nested past the parser's own limit: refused just below
        if value is None or json_too_deep(value):
            raise forms.ValidationError(
                gettext("the arguments are nested deeper than %(limit)d levels")
                % {"limit": MAX_JSON_DEPTH}
            )
        if not isinstance(value, dict):
            raise forms.ValidationError("the arguments must be a JSON object ({...})")
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("decision") == "reject" and data.get("arguments") is not None:
            raise forms.ValidationError("a rejection carries a message, not arguments")
        return data


class _RunIdsField(forms.Field):
    """The ticked rows of the runs page: every `ids` value of the form."""

    widget = forms.MultipleHiddenInput

    def to_python(self, value: Any) -> list[str]:
        if not value:
            return []
        return [str(item).strip() for item in value if str(item).strip()]


class BulkSelectionForm(forms.Form):
    """Which runs a bulk stop is about (DESIGN §12): the ticked rows, or every run matching the
    runs page's filters (no filter at all: every run of the user's teams)."""

    scope = forms.ChoiceField(choices=[("selected", "selected"), ("matching", "matching")])
    ids = _RunIdsField(required=False)
    status = forms.ChoiceField(choices=[("", "any"), *RunStatus.choices], required=False)
    agent = forms.CharField(required=False, max_length=120)
    team = forms.CharField(required=False, max_length=64)
    q = forms.CharField(required=False, max_length=200)

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not data.get("ids"):
            raise forms.ValidationError("Tick at least one run, or stop all matching runs.")
        return data

    def bulk_filter(self) -> BulkFilter:
        data = self.cleaned_data
        if data["scope"] == "selected":
            return BulkFilter(ids=tuple(dict.fromkeys(data["ids"])))
        return BulkFilter(
            status=data["status"],
            agent=data["agent"],
            team=data["team"],
            search=data["q"],
            every_run=True,
        )


class BulkStopForm(BulkSelectionForm):
    reason = forms.ChoiceField(choices=HUMAN_STOP_REASONS, initial=StopReason.USER_STOP)
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Why, in a sentence. It goes into every run's stop packet and the ledger.",
    )
    # Made when the preview is shown: a second click (or a resent form) answers the first bulk
    # stop instead of making another.
    idempotency_key = forms.CharField(max_length=200)
    confirm_large = forms.BooleanField(required=False)
    # The preview the reviewer is looking at: the confirm stops exactly its runs (DESIGN §12).
    preview_id = forms.CharField(required=False, max_length=32)
    # Above TYPE_TO_CONFIRM runs the reviewer types how many, so a wide filter is read, not
    # clicked through.
    typed_count = forms.IntegerField(required=False, min_value=0)

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if admin:
            self.fields["reason"].choices = [*HUMAN_STOP_REASONS, *ADMIN_STOP_REASONS]  # type: ignore[attr-defined]
