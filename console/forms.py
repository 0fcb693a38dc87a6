"""Console forms: they validate input and nothing else (writes happen in the services)."""

from __future__ import annotations

from datetime import datetime, time, timedelta
from typing import Any

from django import forms
from django.utils import timezone

from handoff.models import ResolutionDecision
from runs.models import RunStatus, StopReason, TokenRole

# Reasons a person picks when pressing Stop. manual_takeover is the Take over button;
# lease_expired and drain_deadline are the system's own and never chosen by hand.
HUMAN_STOP_REASONS = [
    (StopReason.USER_STOP.value, "User stop"),
    (StopReason.DEPENDENCY_FAILURE.value, "Dependency failure"),
    (StopReason.BUDGET_EXHAUSTED.value, "Budget exhausted"),
    (StopReason.TIMEOUT.value, "Timeout"),
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


def _aware(value: datetime | None) -> datetime | None:
    if value is None:
        return None
    return timezone.make_aware(value) if timezone.is_naive(value) else value


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
