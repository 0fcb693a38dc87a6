"""Forms of the notification pages: they validate input; the services write."""

from __future__ import annotations

from typing import Any

from django import forms
from django.conf import settings

from notifications.models import ChannelKind, Event


class ChannelForm(forms.Form):
    team = forms.ChoiceField(choices=())
    name = forms.CharField(max_length=120)
    kind = forms.ChoiceField(choices=ChannelKind.choices)
    target = forms.CharField(max_length=1000)
    events = forms.MultipleChoiceField(
        choices=Event.choices, widget=forms.CheckboxSelectMultiple, required=False
    )
    agent_glob = forms.CharField(max_length=120, required=False)
    language = forms.ChoiceField(choices=settings.LANGUAGES, required=False)

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams  # type: ignore[attr-defined]


class ChannelEditForm(forms.Form):
    name = forms.CharField(max_length=120)
    # Blank keeps the current target: a Slack or Apprise URL is never sent back to the page.
    target = forms.CharField(max_length=1000, required=False)
    events = forms.MultipleChoiceField(
        choices=Event.choices, widget=forms.CheckboxSelectMultiple, required=False
    )
    agent_glob = forms.CharField(max_length=120, required=False)
    enabled = forms.BooleanField(required=False)
    language = forms.ChoiceField(choices=settings.LANGUAGES, required=False)


class SubscriptionForm(forms.Form):
    team = forms.ChoiceField(choices=())
    events = forms.MultipleChoiceField(
        choices=Event.choices, widget=forms.CheckboxSelectMultiple, required=False
    )
    agent_glob = forms.CharField(max_length=120, required=False)

    def __init__(self, *args: Any, teams: list[tuple[str, str]], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["team"].choices = teams  # type: ignore[attr-defined]
