"""`/api/v1/policies/` (DESIGN §14): a team's policies. Viewers, reviewers, admins and
reviewer tokens read them; the team's admins write them and test them against history."""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from api.permissions import WrongRole, WrongTeam
from api.views import READ_ERRORS, WRITE_ERRORS, ApiView
from policies.language import CONTEXT
from policies.models import Policy, PolicyAction, PolicyMode, PolicyOnError, PolicyTest
from policies.rule_templates import TEMPLATES
from policies.services import (
    POLICY_FIELDS,
    policy_create,
    policy_delete,
    policy_test,
    policy_update,
)
from runs.access import Capability
from runs.errors import InvalidInput, NotFound
from runs.models import Team

INT64_MAX = 2**63 - 1

POLICY_ID = OpenApiParameter(
    "policy_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="policy id"
)
TEST_ID = OpenApiParameter(
    "test_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="history test id"
)

_RULES = (
    "`expression` is CEL, compiled and type-checked against the context (`run.*`, `call.*`, "
    "`event.type`; see DESIGN §14): an unknown name, a type error or a non-boolean is a 400 "
    "naming the field `expression` with the `line` and `column` of the first error. A team's "
    "policy names are unique. Unknown fields are refused by name."
)


class PolicyIn(serializers.Serializer):
    team = serializers.CharField(required=False, help_text="the team's slug (default: yours)")
    name = serializers.CharField(max_length=120)
    description = serializers.CharField(required=False, allow_blank=True, max_length=500)
    expression = serializers.CharField(max_length=4000, trim_whitespace=False)
    action = serializers.ChoiceField(choices=PolicyAction.values)
    mode = serializers.ChoiceField(choices=PolicyMode.values, required=False)
    on_error = serializers.ChoiceField(choices=PolicyOnError.values, required=False)
    agent_glob = serializers.CharField(required=False, allow_blank=True, max_length=200)
    tool_glob = serializers.CharField(required=False, allow_blank=True, max_length=200)
    enabled = serializers.BooleanField(required=False)

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        unknown = sorted(set(self.initial_data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: "unknown field" for name in unknown})
        return attrs


class PolicyChangeIn(PolicyIn):
    name = serializers.CharField(max_length=120, required=False)
    expression = serializers.CharField(max_length=4000, trim_whitespace=False, required=False)
    action = serializers.ChoiceField(choices=PolicyAction.values, required=False)


class PolicyTestIn(serializers.Serializer):
    team = serializers.CharField(required=False, help_text="the team's slug (default: yours)")
    policy = serializers.IntegerField(
        required=False, min_value=1, help_text="test this saved policy (else give `expression`)"
    )
    expression = serializers.CharField(required=False, max_length=4000, trim_whitespace=False)
    days = serializers.IntegerField(required=False, default=7, min_value=1, max_value=90)
    agent_glob = serializers.CharField(required=False, allow_blank=True, max_length=200)
    tool_glob = serializers.CharField(required=False, allow_blank=True, max_length=200)


_POLICY_OUT: dict[str, Any] = {
    "id": serializers.IntegerField(),
    "team": serializers.CharField(),
    "name": serializers.CharField(),
    "description": serializers.CharField(),
    "expression": serializers.CharField(),
    "action": serializers.ChoiceField(choices=PolicyAction.values),
    "mode": serializers.ChoiceField(choices=PolicyMode.values),
    "on_error": serializers.ChoiceField(choices=PolicyOnError.values),
    "agent_glob": serializers.CharField(),
    "tool_glob": serializers.CharField(),
    "enabled": serializers.BooleanField(),
    "errors_count": serializers.IntegerField(),
    "last_error": serializers.CharField(),
    "last_error_at": serializers.DateTimeField(allow_null=True),
    "created_by": serializers.CharField(),
    "created_at": serializers.DateTimeField(),
    "updated_at": serializers.DateTimeField(),
}
PolicyOut = inline_serializer("PolicyOut", _POLICY_OUT)
PolicyListOut = inline_serializer(
    "PolicyListOut",
    {
        "results": inline_serializer("PolicyListItem", _POLICY_OUT, many=True),
        "templates": serializers.ListField(child=serializers.DictField()),
        "context": serializers.DictField(child=serializers.CharField()),
    },
)
_RESULT: dict[str, Any] = {
    "days": serializers.IntegerField(),
    "since": serializers.DateTimeField(),
    "events": serializers.IntegerField(),
    "runs": serializers.IntegerField(),
    "runs_acted_on": serializers.IntegerField(),
    "runs_with_errors": serializers.IntegerField(),
    "examples": serializers.ListField(child=serializers.DictField()),
}
PolicyTestResultOut = inline_serializer("PolicyTestResultOut", _RESULT)
PolicyTestOut = inline_serializer(
    "PolicyTestOut",
    {
        "id": serializers.IntegerField(),
        "status": serializers.CharField(),
        "done": serializers.IntegerField(),
        "total": serializers.IntegerField(),
        "result": inline_serializer("PolicyTestResult", _RESULT, allow_null=True),
        "error": serializers.CharField(),
    },
)


def policy_json(policy: Policy) -> dict[str, Any]:
    return {
        "id": policy.pk,
        "team": policy.team.slug,
        **{
            name: getattr(policy, name)
            for name in (*POLICY_FIELDS, "errors_count", "last_error", "created_by")
        },
        "last_error_at": policy.last_error_at.isoformat() if policy.last_error_at else None,
        "created_at": policy.created_at.isoformat(),
        "updated_at": policy.updated_at.isoformat(),
    }


def test_json(test: PolicyTest) -> dict[str, Any]:
    return {
        "id": test.pk,
        "status": test.status,
        "done": test.done,
        "total": test.total,
        "result": test.result,
        "error": test.error,
    }


_WHY_NOT = {
    Capability.APPROVALS: "policies are read by the team's members and reviewer tokens",
    Capability.ADMIN: "policies are written and tested by the team's admins",
}


def _policy_for(view: ApiView, policy_id: int, capability: Capability) -> Policy:
    missing = f"policy {policy_id} does not exist"
    found = (
        Policy.objects.select_related("team").filter(pk=policy_id).first()
        if 0 < policy_id <= INT64_MAX
        else None
    )
    if found is None:
        raise NotFound(missing)
    if not view.caller.may(Capability.READ, found.team_id):
        raise WrongTeam(missing)
    if not view.caller.may(capability, found.team_id):
        raise WrongRole(_WHY_NOT[capability])
    return found


def _team(view: ApiView, slug: str | None) -> Team:
    """The team named, or the caller's only administered team."""
    if slug is None:
        team_ids = view.caller.team_ids(Capability.ADMIN)
        if team_ids is not None and len(team_ids) == 1:
            return Team.objects.get(pk=team_ids[0])
        raise InvalidInput("team: name the team (its slug)", field="team")
    team = Team.objects.filter(slug=slug).first()
    if team is None or not view.caller.may(Capability.READ, team.pk):
        raise NotFound(f"team {slug[:64]!r} does not exist")
    if not view.caller.may(Capability.ADMIN, team.pk):
        raise WrongRole(_WHY_NOT[Capability.ADMIN])
    return team


class PoliciesView(ApiView):
    @extend_schema(
        operation_id="policies_list",
        summary="The policies of your teams, the rule templates and the expression context",
        description="Viewers, reviewers, admins and reviewer tokens (agent tokens: 403). "
        "`templates` are the six common rules; `context` names every value an expression may "
        "read, with its meaning.",
        responses={200: PolicyListOut, **READ_ERRORS},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.APPROVALS)
        team_ids = self.caller.team_ids(Capability.APPROVALS)
        policies = Policy.objects.select_related("team").order_by("team__slug", "name")
        if team_ids is not None:
            policies = policies.filter(team_id__in=team_ids)
        return Response(
            {
                "results": [policy_json(policy) for policy in policies],
                "templates": [template.as_json() for template in TEMPLATES],
                "context": {name: doc for name, (_kind, doc) in CONTEXT.items()},
            }
        )

    @extend_schema(
        operation_id="policies_create",
        summary="Create a policy (team admins)",
        description="201 with the policy; the ledger records it (`policy.created`). A new "
        "policy is in `observe` mode unless `mode` says `enforce`. " + _RULES,
        request=PolicyIn,
        responses={201: PolicyOut, **WRITE_ERRORS},
    )
    def post(self, request: Request) -> Response:
        self.caller.require(Capability.ADMIN)
        data = self.parse(PolicyIn)
        team = _team(self, data.pop("team", None))
        policy = policy_create(team_id=team.pk, actor=self.caller.actor, **data)
        return Response(
            policy_json(_policy_for(self, policy.pk, Capability.ADMIN)),
            status=status.HTTP_201_CREATED,
        )


class PolicyDetailView(ApiView):
    @extend_schema(
        operation_id="policies_retrieve",
        summary="One policy, with its evaluation errors",
        parameters=[POLICY_ID],
        responses={200: PolicyOut, **READ_ERRORS},
    )
    def get(self, request: Request, policy_id: int) -> Response:
        return Response(policy_json(_policy_for(self, policy_id, Capability.APPROVALS)))

    @extend_schema(
        operation_id="policies_update",
        summary="Change some fields of a policy (team admins)",
        description="Only the fields given change; runs in flight see the change at their next "
        "fact. The ledger keeps each changed field's old and new value (`policy.updated`). "
        + _RULES,
        parameters=[POLICY_ID],
        request=PolicyChangeIn,
        responses={200: PolicyOut, **WRITE_ERRORS},
    )
    def patch(self, request: Request, policy_id: int) -> Response:
        policy = _policy_for(self, policy_id, Capability.ADMIN)
        data = self.parse(PolicyChangeIn)
        data.pop("team", None)
        policy_update(policy_id=policy.pk, actor=self.caller.actor, **data)
        return Response(policy_json(_policy_for(self, policy.pk, Capability.ADMIN)))

    @extend_schema(
        operation_id="policies_destroy",
        summary="Delete a policy (team admins)",
        description="204. Its hits keep its name and expression; the ledger keeps the deleted "
        "policy (`policy.deleted`).",
        parameters=[POLICY_ID],
        responses={204: None, **WRITE_ERRORS},
    )
    def delete(self, request: Request, policy_id: int) -> Response:
        policy = _policy_for(self, policy_id, Capability.ADMIN)
        policy_delete(policy_id=policy.pk, actor=self.caller.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PolicyTestView(ApiView):
    @extend_schema(
        operation_id="policies_test",
        summary="Test a policy against history (team admins)",
        description="Replays the team's recorded events of the last `days` (1–90, default 7) "
        "through `expression` (or the saved `policy`'s) and answers how many runs it would have "
        "acted on, with up to five examples and the values each saw. Up to 100,000 events the "
        "answer is 200 at once; above, 202 with a test to poll at "
        "`/api/v1/policies/test/{id}/` (`done` of `total` events). " + _RULES,
        request=PolicyTestIn,
        responses={
            200: PolicyTestResultOut,
            202: PolicyTestOut,
            **WRITE_ERRORS,
        },
    )
    def post(self, request: Request) -> Response:
        self.caller.require(Capability.ADMIN)
        data = self.parse(PolicyTestIn)
        if data.get("policy") is not None:
            saved = _policy_for(self, data["policy"], Capability.ADMIN)
            team = saved.team
            expression = data.get("expression") or saved.expression
            data.setdefault("agent_glob", saved.agent_glob)
            data.setdefault("tool_glob", saved.tool_glob)
        else:
            team = _team(self, data.get("team"))
            expression = data.get("expression", "")
            if not expression:
                raise InvalidInput("expression (or policy) is required", field="expression")
        answer = policy_test(
            team=team,
            actor=self.caller.actor,
            expression=expression,
            days=data["days"],
            agent_glob=data.get("agent_glob") or "*",
            tool_glob=data.get("tool_glob") or "*",
        )
        if isinstance(answer, PolicyTest):
            return Response(test_json(answer), status=status.HTTP_202_ACCEPTED)
        return Response(answer)


class PolicyTestDetailView(ApiView):
    @extend_schema(
        operation_id="policies_test_retrieve",
        summary="A background test against history: its progress, then its result",
        parameters=[TEST_ID],
        responses={200: PolicyTestOut, **READ_ERRORS},
    )
    def get(self, request: Request, test_id: int) -> Response:
        missing = f"policy test {test_id} does not exist"
        test = PolicyTest.objects.filter(pk=test_id).first() if 0 < test_id <= INT64_MAX else None
        if test is None or not self.caller.may(Capability.READ, test.team_id):
            raise NotFound(missing)
        if not self.caller.may(Capability.ADMIN, test.team_id):
            raise WrongRole(_WHY_NOT[Capability.ADMIN])
        return Response(test_json(test))
