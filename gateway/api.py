"""`/api/v1/mcp/upstreams/`: team admins register the MCP servers the gateway reaches.

Secrets (a stdio command's `env`, an HTTP upstream's `headers`) are taken once and never
shown again: answers name them (`env_names`, `header_names`), never their values.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response

from api.permissions import WrongRole
from api.views import READ_ERRORS, WRITE_ERRORS, ApiView
from gateway.models import McpUpstream, Transport
from gateway.services import upstream_create, upstream_delete
from runs.access import Capability
from runs.errors import InvalidInput, NotFound
from runs.models import Team


class UpstreamIn(serializers.Serializer):
    team = serializers.CharField(help_text="the team's slug")
    name = serializers.CharField(help_text="the path: agents connect to /mcp/<name>/")
    transport = serializers.ChoiceField(choices=Transport.values)
    command = serializers.CharField(required=False, allow_blank=True)
    args = serializers.ListField(child=serializers.CharField(allow_blank=True), required=False)
    env = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)
    url = serializers.CharField(required=False, allow_blank=True)
    headers = serializers.DictField(child=serializers.CharField(allow_blank=True), required=False)


UPSTREAM_OUT_FIELDS: dict[str, Any] = {
    "id": serializers.IntegerField(),
    "team": serializers.CharField(),
    "name": serializers.CharField(),
    "transport": serializers.CharField(),
    "command": serializers.CharField(),
    "args": serializers.ListField(child=serializers.CharField()),
    "env_names": serializers.ListField(child=serializers.CharField()),
    "url": serializers.CharField(),
    "header_names": serializers.ListField(child=serializers.CharField()),
    "endpoint": serializers.CharField(),
    "created_by": serializers.CharField(),
    "created_at": serializers.DateTimeField(),
}
UpstreamOut = inline_serializer("McpUpstreamOut", UPSTREAM_OUT_FIELDS)
UpstreamListOut = inline_serializer("McpUpstreamListOut", UPSTREAM_OUT_FIELDS, many=True)


def upstream_json(upstream: McpUpstream) -> dict[str, Any]:
    return {
        "id": upstream.pk,
        "team": upstream.team.slug,
        "name": upstream.name,
        "transport": upstream.transport,
        "command": upstream.command,
        "args": upstream.args,
        "env_names": upstream.env_names,
        "url": upstream.url,
        "header_names": upstream.header_names,
        "endpoint": f"/mcp/{upstream.name}/",
        "created_by": upstream.created_by,
        "created_at": upstream.created_at.isoformat(),
    }


class UpstreamsView(ApiView):
    def _visible(self) -> QuerySet[McpUpstream]:
        team_ids = self.caller.team_ids(Capability.ADMIN)
        upstreams = McpUpstream.objects.select_related("team")
        return upstreams if team_ids is None else upstreams.filter(team_id__in=team_ids)

    @extend_schema(
        operation_id="mcp_upstreams_list",
        summary="The MCP upstreams of the teams the caller administers (no secrets)",
        responses={200: UpstreamListOut, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.ADMIN)
        return Response([upstream_json(u) for u in self._visible()])

    @extend_schema(
        operation_id="mcp_upstreams_create",
        summary="Register an upstream MCP server (team admins); its secrets are never shown again",
        request=UpstreamIn,
        responses={201: UpstreamOut, **WRITE_ERRORS},
    )
    def post(self, request: Request) -> Response:
        data = self.parse(UpstreamIn)
        team = Team.objects.filter(slug=data["team"]).first()
        if team is None or not self.caller.may(Capability.READ, team.pk):
            raise NotFound(f"no team {data['team']!r}")
        if not self.caller.may(Capability.ADMIN, team.pk):
            raise WrongRole("registering an MCP upstream needs an admin of the team")
        upstream = upstream_create(
            team=team,
            name=data["name"],
            transport=data["transport"],
            actor=self.caller.actor,
            command=data.get("command", ""),
            args=data.get("args"),
            env=data.get("env"),
            url=data.get("url", ""),
            headers=data.get("headers"),
        )
        return Response(upstream_json(upstream), status=201)


class UpstreamDetailView(ApiView):
    @extend_schema(
        operation_id="mcp_upstreams_destroy",
        summary="Remove an upstream (team admins); open sessions keep their connection",
        responses={204: None, **WRITE_ERRORS},
    )
    def delete(self, request: Request, upstream_id: str) -> Response:
        self.caller.require(Capability.ADMIN)
        if not upstream_id.isdigit() or len(upstream_id) > 18:
            raise InvalidInput("upstream id must be a number", field="id")
        upstream_delete(
            upstream_id=int(upstream_id),
            team_ids=self.caller.team_ids(Capability.ADMIN),
            actor=self.caller.actor,
        )
        return Response(status=204)
