"""Console forms: they validate input and nothing else (writes happen in the services)."""

from __future__ import annotations

import json
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone
from django.utils.translation import gettext, gettext_lazy

from handoff.models import ResolutionDecision
from policies.models import PolicyAction, PolicyMode, PolicyOnError
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
    (StopReason.USER_STOP.value, gettext_lazy("User stop")),
    (StopReason.DEPENDENCY_FAILURE.value, gettext_lazy("Dependency failure")),
]
ADMIN_STOP_REASONS = [(StopReason.ADMIN_KILL.value, gettext_lazy("Admin kill (admins only)"))]


class StopForm(forms.Form):
    reason = forms.ChoiceField(
        choices=HUMAN_STOP_REASONS, initial=StopReason.USER_STOP, label=gettext_lazy("Reason")
    )
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Note"),
        help_text=gettext_lazy("Why, in a sentence. It goes into the stop packet and the ledger."),
    )

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if admin:
            self.fields["reason"].choices = [*HUMAN_STOP_REASONS, *ADMIN_STOP_REASONS]  # type: ignore[attr-defined]


class NoteForm(forms.Form):
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Note"),
    )


class CloseNoteForm(forms.Form):
    """Closing ends a run for good: the reason is required (it goes to the ledger)."""

    note = forms.CharField(
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Note"),
        error_messages={"required": gettext_lazy("Say why the run is closed.")},
    )


class HandoffAcceptForm(forms.Form):
    # Set when the person confirmed taking a handoff assigned to someone else.
    take_from_assignee = forms.BooleanField(
        required=False, label=gettext_lazy("Take it from its assignee")
    )


class HandoffFilterForm(forms.Form):
    """The handoff inbox: whose (`me`, `none`, a username, or everyone's) and in which order."""

    assignee = forms.CharField(required=False, max_length=150, label=gettext_lazy("Assignee"))
    sort = forms.ChoiceField(
        required=False,
        label=gettext_lazy("Order"),
        choices=[
            ("oldest", gettext_lazy("Oldest first")),
            ("newest", gettext_lazy("Newest first")),
        ],
    )
    mine = forms.CharField(
        required=False, max_length=1, label=gettext_lazy("Handed to me")
    )  # the "Handed to me" tab: assignee=me


class HandoffAssignForm(forms.Form):
    """`me`, a teammate's username, or empty for nobody."""

    assignee = forms.CharField(required=False, max_length=150, label=gettext_lazy("Assign to"))


class SteeringForm(forms.Form):
    text = forms.CharField(
        max_length=10_000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Message to the agent"),
    )


class SteeringDecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[
            ("carry_over", gettext_lazy("Carry over")),
            ("discard", gettext_lazy("Discard")),
        ],
        label=gettext_lazy("Decision"),
    )


class ResumeForm(forms.Form):
    checkpoint = forms.ChoiceField(
        required=False,
        choices=[("", gettext_lazy("Where it stopped (latest resume point)"))],
        label=gettext_lazy("Resume from"),
    )
    carry_over_steering = forms.BooleanField(
        required=False,
        label=gettext_lazy("Carry over unapplied steering messages (otherwise they are discarded)"),
    )
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Note"),
    )

    def __init__(self, *args: Any, checkpoints: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["checkpoint"].choices = [  # type: ignore[attr-defined]
            ("", gettext("Where it stopped (latest resume point)")),
            *[(label, label) for label in checkpoints or []],
        ]


class ResolutionForm(forms.Form):
    target = forms.ChoiceField(
        choices=[
            ("tool_call", gettext_lazy("Tool call")),
            ("outbox", gettext_lazy("Outbox item")),
            ("worker", gettext_lazy("Worker")),
        ],
        label=gettext_lazy("What it is about"),
    )
    target_id = forms.CharField(max_length=120, label=gettext_lazy("Which one"))
    decision = forms.ChoiceField(
        choices=ResolutionDecision.choices,
        widget=forms.RadioSelect,
        label=gettext_lazy("Decision"),
    )
    evidence = forms.CharField(
        max_length=5000,
        label=gettext_lazy("Evidence"),
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text=gettext_lazy("How you know: a query result, a ticket, a log line."),
    )


class RunFilterForm(forms.Form):
    status = forms.ChoiceField(
        required=False,
        choices=[("", gettext_lazy("Any status")), *RunStatus.choices],
        label=gettext_lazy("Status"),
    )
    agent = forms.CharField(required=False, max_length=120, label=gettext_lazy("Agent"))
    team = forms.CharField(required=False, max_length=64, label=gettext_lazy("Team"))
    q = forms.CharField(required=False, max_length=200, label=gettext_lazy("Search"))
    after = forms.CharField(required=False, max_length=200, label=gettext_lazy("After"))
    before = forms.CharField(required=False, max_length=200, label=gettext_lazy("Before"))
    sort = forms.ChoiceField(
        required=False,
        label=gettext_lazy("Sort"),
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
        raise forms.ValidationError(gettext("This date is out of range.")) from None


class AuditFilterForm(forms.Form):
    actor = forms.CharField(required=False, max_length=150, label=gettext_lazy("Actor"))
    action = forms.CharField(required=False, max_length=60, label=gettext_lazy("Action"))
    reason = forms.CharField(required=False, max_length=60, label=gettext_lazy("Reason"))
    team = forms.CharField(required=False, max_length=64, label=gettext_lazy("Team"))
    run = forms.CharField(required=False, max_length=32, label=gettext_lazy("Run"))
    since = forms.DateTimeField(
        required=False,
        label=gettext_lazy("From"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    until = forms.DateTimeField(
        required=False,
        label=gettext_lazy("Until"),
        input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%d"],
        widget=forms.DateTimeInput(attrs={"type": "datetime-local"}),
    )
    after = forms.IntegerField(required=False, min_value=1, label=gettext_lazy("After entry"))

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
        label=gettext_lazy("Period"),
        choices=[
            ("24h", gettext_lazy("Last 24 hours")),
            ("7d", gettext_lazy("Last 7 days")),
            ("30d", gettext_lazy("Last 30 days")),
            ("90d", gettext_lazy("Last 90 days")),
            ("custom", gettext_lazy("Custom")),
        ],
    )
    since = forms.DateField(
        required=False, widget=forms.DateInput(attrs={"type": "date"}), label=gettext_lazy("From")
    )
    until = forms.DateField(
        required=False,
        widget=forms.DateInput(attrs={"type": "date"}),
        label=gettext_lazy("To (inclusive)"),
    )
    team = forms.CharField(required=False, max_length=64, label=gettext_lazy("Team"))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        since, until = data.get("since"), data.get("until")
        if data.get("period") == "custom" or (since and until):
            if not since or not until:
                raise forms.ValidationError(gettext("A custom period needs both dates."))
            if since > until:
                raise forms.ValidationError(gettext("The start date is after the end date."))
            if until >= date.max:  # the window ends the day after `until`
                raise forms.ValidationError(
                    gettext("The end date must be before %(max)s.") % {"max": date.max}
                )
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
    team = forms.ChoiceField(choices=[], label=gettext_lazy("Team"))
    name = forms.CharField(max_length=120, label=gettext_lazy("Name"))
    role = forms.ChoiceField(
        choices=TokenRole.choices, initial=TokenRole.AGENT, label=gettext_lazy("Role")
    )

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams or []  # type: ignore[attr-defined]


# --------------------------------------------------------------------------------------------
# approvals (DESIGN §10)

APPROVAL_TABS = [
    ("waiting", gettext_lazy("Waiting")),
    ("approved", gettext_lazy("Approved")),
    ("rejected", gettext_lazy("Rejected")),
    ("expired", gettext_lazy("Expired")),
    ("void", gettext_lazy("Void")),
    ("all", gettext_lazy("All")),
]


class ApprovalFilterForm(forms.Form):
    status = forms.ChoiceField(required=False, choices=APPROVAL_TABS, label=gettext_lazy("Status"))
    team = forms.CharField(required=False, max_length=64, label=gettext_lazy("Team"))
    agent = forms.CharField(required=False, max_length=120, label=gettext_lazy("Agent"))
    tool = forms.CharField(
        required=False, max_length=200, label=gettext_lazy("Tool or destination")
    )
    risk = forms.ChoiceField(
        required=False,
        choices=[("", gettext_lazy("Any risk")), *ApprovalRisk.choices],
        label=gettext_lazy("Risk"),
    )
    run = forms.CharField(required=False, max_length=32, label=gettext_lazy("Run"))


class ApprovalRuleForm(forms.Form):
    """Types and choices only: what a glob may hold, which transports exist and how the fields
    fit together are the service's checks (`runs.services.approval_rules`), shown on the form."""

    # Posted keys that are not fields: the CSRF token, and the team on the create form.
    ALLOWED_EXTRA = frozenset({"csrfmiddlewaretoken"})

    name = forms.CharField(max_length=120, label=gettext_lazy("Name"))
    enabled = forms.BooleanField(required=False, initial=True, label=gettext_lazy("Enabled"))
    position = forms.IntegerField(
        min_value=0, max_value=1_000_000, initial=100, label=gettext_lazy("Order")
    )
    applies_to = forms.ChoiceField(
        choices=ApprovalAppliesTo.choices,
        initial=ApprovalAppliesTo.ANY,
        label=gettext_lazy("Holds"),
    )
    tool_glob = forms.CharField(
        required=False, max_length=200, strip=False, label=gettext_lazy("Tool name")
    )
    side_effect = forms.ChoiceField(
        required=False,
        label=gettext_lazy("Side effect"),
        choices=[
            ("", gettext_lazy("Any call")),
            (SideEffect.WRITE.value, gettext_lazy("Writes only")),
        ],
    )
    agent_glob = forms.CharField(
        required=False, max_length=200, strip=False, label=gettext_lazy("Agent")
    )
    transport = forms.CharField(required=False, max_length=16, label=gettext_lazy("Transport"))
    destination_glob = forms.CharField(
        required=False, max_length=500, strip=False, label=gettext_lazy("Destination")
    )
    risk = forms.ChoiceField(
        choices=ApprovalRisk.choices, initial=ApprovalRisk.MEDIUM, label=gettext_lazy("Risk")
    )
    timeout_seconds = forms.IntegerField(
        min_value=1, max_value=86_400, initial=900, label=gettext_lazy("Deadline")
    )
    escalate_after_seconds = forms.IntegerField(
        required=False, min_value=1, max_value=86_400, label=gettext_lazy("Escalate after")
    )

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"] = forms.ChoiceField(choices=teams, label=gettext_lazy("Team"))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        unknown = sorted(set(self.data) - set(self.fields) - self.ALLOWED_EXTRA)
        if unknown:
            raise forms.ValidationError(
                gettext("unknown field: %(join)s") % {"join": ", ".join(unknown)}
            )
        return data

    def rule_fields(self) -> dict[str, Any]:
        """The cleaned values, as the rule services take them."""
        return {name: self.cleaned_data[name] for name in self.fields if name != "team"}


class ApprovalDecisionForm(forms.Form):
    decision = forms.ChoiceField(
        choices=[("approve", gettext_lazy("Approve")), ("reject", gettext_lazy("Reject"))],
        label=gettext_lazy("Decision"),
    )
    message = forms.CharField(
        required=False, max_length=4000, label=gettext_lazy("Message to the agent")
    )
    # The edited arguments, as JSON text; blank means "as they are".
    arguments = forms.CharField(
        required=False, max_length=200_000, strip=False, label=gettext_lazy("Arguments")
    )

    def clean_arguments(self) -> dict[str, Any] | None:
        text = self.cleaned_data.get("arguments") or ""
        if not text.strip():
            return None
        try:
            value = json.loads(text)
        except ValueError as error:
            raise forms.ValidationError(
                gettext("not valid JSON: %(error)s") % {"error": error}
            ) from None
        except RecursionError:
            value = None  # nested past the parser's own limit: refused just below
        if value is None or json_too_deep(value):
            raise forms.ValidationError(
                gettext("the arguments are nested deeper than %(limit)d levels")
                % {"limit": MAX_JSON_DEPTH}
            )
        if not isinstance(value, dict):
            raise forms.ValidationError(gettext("the arguments must be a JSON object ({...})"))
        return value

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("decision") == "reject" and data.get("arguments") is not None:
            raise forms.ValidationError(gettext("a rejection carries a message, not arguments"))
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

    scope = forms.ChoiceField(
        choices=[
            ("selected", gettext_lazy("The ticked runs")),
            ("matching", gettext_lazy("Every matching run")),
        ],
        label=gettext_lazy("Which runs"),
    )
    ids = _RunIdsField(required=False, label=gettext_lazy("Runs"))
    status = forms.ChoiceField(
        choices=[("", gettext_lazy("Any status")), *RunStatus.choices],
        required=False,
        label=gettext_lazy("Status"),
    )
    agent = forms.CharField(required=False, max_length=120, label=gettext_lazy("Agent"))
    team = forms.CharField(required=False, max_length=64, label=gettext_lazy("Team"))
    q = forms.CharField(required=False, max_length=200, label=gettext_lazy("Search"))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        if data.get("scope") == "selected" and not data.get("ids"):
            raise forms.ValidationError(
                gettext("Tick at least one run, or stop all matching runs.")
            )
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
    reason = forms.ChoiceField(
        choices=HUMAN_STOP_REASONS, initial=StopReason.USER_STOP, label=gettext_lazy("Reason")
    )
    note = forms.CharField(
        required=False,
        max_length=2000,
        widget=forms.Textarea(attrs={"rows": 2}),
        label=gettext_lazy("Note"),
        help_text=gettext_lazy(
            "Why, in a sentence. It goes into every run's stop packet and the ledger."
        ),
    )
    # Made when the preview is shown: a second click (or a resent form) answers the first bulk
    # stop instead of making another.
    idempotency_key = forms.CharField(max_length=200, label=gettext_lazy("Idempotency key"))
    confirm_large = forms.BooleanField(required=False, label=gettext_lazy("Confirm"))
    # The preview the reviewer is looking at: the confirm stops exactly its runs (DESIGN §12).
    preview_id = forms.CharField(required=False, max_length=32, label=gettext_lazy("Preview"))
    # Above TYPE_TO_CONFIRM runs the reviewer types how many, so a wide filter is read, not
    # clicked through.
    typed_count = forms.IntegerField(
        required=False, min_value=0, label=gettext_lazy("Number of runs")
    )

    def __init__(self, *args: Any, admin: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if admin:
            self.fields["reason"].choices = [*HUMAN_STOP_REASONS, *ADMIN_STOP_REASONS]  # type: ignore[attr-defined]


class PolicyForm(forms.Form):
    """Types and choices only: the expression's compile and type check, the globs and the
    unique name are the service's checks (`policies.services`), shown on their fields."""

    ALLOWED_EXTRA = frozenset({"csrfmiddlewaretoken"})

    name = forms.CharField(max_length=120, label=gettext_lazy("Name"))
    description = forms.CharField(required=False, max_length=500, label=gettext_lazy("Description"))
    expression = forms.CharField(
        max_length=4000, strip=False, widget=forms.Textarea, label=gettext_lazy("Expression")
    )
    action = forms.ChoiceField(
        choices=PolicyAction.choices, initial=PolicyAction.STOP, label=gettext_lazy("Action")
    )
    mode = forms.ChoiceField(
        choices=PolicyMode.choices, initial=PolicyMode.OBSERVE, label=gettext_lazy("Mode")
    )
    on_error = forms.ChoiceField(
        choices=PolicyOnError.choices,
        initial=PolicyOnError.REQUIRE_APPROVAL,
        label=gettext_lazy("On an evaluation error"),
    )
    agent_glob = forms.CharField(
        required=False, max_length=200, initial="*", label=gettext_lazy("Agents (glob)")
    )
    tool_glob = forms.CharField(
        required=False, max_length=200, initial="*", label=gettext_lazy("Tools (glob)")
    )
    enabled = forms.BooleanField(required=False, initial=True, label=gettext_lazy("Enabled"))

    def __init__(
        self, *args: Any, teams: list[tuple[str, str]] | None = None, **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        if teams is not None:
            self.fields["team"] = forms.ChoiceField(choices=teams, label=gettext_lazy("Team"))

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        unknown = sorted(set(self.data) - set(self.fields) - self.ALLOWED_EXTRA)
        if unknown:
            raise forms.ValidationError(
                gettext("unknown field: %(join)s") % {"join": ", ".join(unknown)}
            )
        return data

    def policy_fields(self) -> dict[str, Any]:
        return {name: self.cleaned_data[name] for name in self.fields if name != "team"}


class PolicyTestForm(forms.Form):
    days = forms.IntegerField(min_value=1, max_value=90, initial=7, label=gettext_lazy("Days"))
