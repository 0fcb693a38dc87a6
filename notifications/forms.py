"""Forms of the notification pages: they validate input; the services write."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings
from django.utils.translation import gettext_lazy

from notifications.models import ChannelKind, Event


class ChannelForm(forms.Form):
    team = forms.ChoiceField(choices=(), label=gettext_lazy("Team"))
    name = forms.CharField(max_length=120, label=gettext_lazy("Name"))
    kind = forms.ChoiceField(choices=ChannelKind.choices, label=gettext_lazy("Kind"))
    target = forms.CharField(max_length=1000, label=gettext_lazy("Target"))
    events = forms.MultipleChoiceField(
        choices=Event.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label=gettext_lazy("Events"),
    )
    agent_glob = forms.CharField(max_length=120, required=False, label=gettext_lazy("Agent"))
    language = forms.ChoiceField(
        choices=settings.LANGUAGES, required=False, label=gettext_lazy("Language of its messages")
    )

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams  # type: ignore[attr-defined]


class ChannelEditForm(forms.Form):
    name = forms.CharField(max_length=120, label=gettext_lazy("Name"))
    # Blank keeps the current target: a Slack or Apprise URL is never sent back to the page.
    target = forms.CharField(max_length=1000, required=False, label=gettext_lazy("Target"))
    events = forms.MultipleChoiceField(
        choices=Event.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label=gettext_lazy("Events"),
    )
    agent_glob = forms.CharField(max_length=120, required=False, label=gettext_lazy("Agent"))
    enabled = forms.BooleanField(required=False, label=gettext_lazy("Enabled"))
    language = forms.ChoiceField(
        choices=settings.LANGUAGES, required=False, label=gettext_lazy("Language of its messages")
    )


class SubscriptionForm(forms.Form):
    team = forms.ChoiceField(choices=(), label=gettext_lazy("Team"))
    events = forms.MultipleChoiceField(
        choices=Event.choices,
        widget=forms.CheckboxSelectMultiple,
        required=False,
        label=gettext_lazy("Events"),
    )
    agent_glob = forms.CharField(max_length=120, required=False, label=gettext_lazy("Agent"))

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams  # type: ignore[attr-defined]
