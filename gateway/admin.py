"""The Django admin's view of upstreams: add through `upstream_create` (validated, sealed,
ledgered); secrets are write-only (their names are shown, never their values)."""

from __future__ import annotations

import json
from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from gateway.models import McpSession, McpUpstream, Transport
from gateway.services import upstream_create, upstream_validate
from runs.actors import Actor
from runs.errors import InvalidInput
from runs.models import Team


def _json(value: str, *, kind: type, field: str) -> Any:
    if not value.strip():
        return kind()
    try:
        parsed = json.loads(value)
    except ValueError as error:
        raise forms.ValidationError(f"{field} must be JSON") from error
    if not isinstance(parsed, kind):
        raise forms.ValidationError(f"{field} must be a JSON {kind.__name__}")
    return parsed


class UpstreamAddForm(forms.ModelForm):
    team = forms.ModelChoiceField(queryset=Team.objects.all())
    transport = forms.ChoiceField(choices=Transport.choices)
    args_json = forms.CharField(
        label="args", required=False, widget=forms.Textarea, help_text='a JSON list: ["stdio"]'
    )
    env_json = forms.CharField(
        label="env (secret)",
        required=False,
        widget=forms.Textarea,
        help_text="a JSON object; encrypted, never shown again",
    )
    headers_json = forms.CharField(
        label="headers (secret)",
        required=False,
        widget=forms.Textarea,
        help_text="a JSON object; encrypted, never shown again",
    )

    class Meta:
        model = McpUpstream
        fields = ["team", "name", "transport", "command", "url"]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        data["args"] = _json(data.get("args_json", ""), kind=list, field="args")
        data["env"] = _json(data.get("env_json", ""), kind=dict, field="env")
        data["headers"] = _json(data.get("headers_json", ""), kind=dict, field="headers")
        try:
            upstream_validate(
                name=data.get("name", ""),
                transport=data.get("transport", ""),
                command=data.get("command") or "",
                args=data["args"],
                env=data["env"],
                url=data.get("url") or "",
                headers=data["headers"],
            )
        except InvalidInput as error:
            raise forms.ValidationError(error.detail) from error
        team = data.get("team")
        if (
            team is not None
            and McpUpstream.objects.filter(team=team, name=data.get("name")).exists()
        ):
            raise forms.ValidationError(f"team {team.slug} already has an upstream of this name")
        return data


@admin.register(McpUpstream)
class McpUpstreamAdmin(admin.ModelAdmin):
    list_display = ("name", "team", "transport", "command", "url", "enabled", "created_at")
    list_filter = ("transport", "enabled", "team")
    exclude = ("env_sealed", "headers_sealed")
    readonly_fields = (
        "team",
        "name",
        "transport",
        "command",
        "args",
        "env_names",
        "url",
        "header_names",
        "created_by",
        "created_at",
    )

    def get_form(
        self, request: HttpRequest, obj: Any = None, change: bool = False, **kwargs: Any
    ) -> Any:
        if obj is None:
            kwargs["form"] = UpstreamAddForm
            kwargs["fields"] = None
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        return self.readonly_fields if obj is not None else ()

    def get_fields(self, request: HttpRequest, obj: Any = None) -> Any:
        if obj is None:
            return [
                "team",
                "name",
                "transport",
                "command",
                "args_json",
                "env_json",
                "url",
                "headers_json",
            ]
        return [*self.readonly_fields, "enabled"]

    def save_model(self, request: HttpRequest, obj: Any, form: Any, change: bool) -> None:
        if change:
            super().save_model(request, obj, form, change)
            return
        data = form.cleaned_data
        created = upstream_create(
            team=data["team"],
            name=data["name"],
            transport=data["transport"],
            actor=Actor.for_user(request.user),
            command=data.get("command") or "",
            args=data["args"],
            env=data["env"],
            url=data.get("url") or "",
            headers=data["headers"],
        )
        obj.pk = created.pk

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        # Removing goes through `DELETE /api/v1/mcp/upstreams/{id}/`, which writes the ledger.
        return False


@admin.register(McpSession)
class McpSessionAdmin(admin.ModelAdmin):
    list_display = ("public_id", "run", "upstream_name", "client_name", "started_at", "end_reason")
    readonly_fields = [f.name for f in McpSession._meta.fields]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False
