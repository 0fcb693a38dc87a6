"""The one role → capability table (runs.access): the API's Caller and the console's Access
answer from it and agree."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

import pytest

from api.permissions import Caller
from console.access import Access, access_for
from runs.access import (
    EVERY_TEAM_CAPABILITIES,
    ROLE_CAPABILITIES,
    TOKEN_CAPABILITIES,
    Capability,
    stop_reason_refusal,
)
from runs.models import Role, StopReason, TokenRole

pytestmark = pytest.mark.django_db


def _caller(user) -> Caller:
    # What from_request reads of a DRF request: the authenticated user, and no token.
    return Caller.from_request(cast(Any, SimpleNamespace(auth=None, user=user)))


def test_the_membership_roles_are_nested():
    viewer, reviewer, admin = (ROLE_CAPABILITIES[role] for role in Role)
    assert viewer < reviewer < admin
    assert EVERY_TEAM_CAPABILITIES == admin


def test_only_tokens_work_and_no_token_administers():
    assert all(Capability.WORK not in held for held in ROLE_CAPABILITIES.values())
    assert all(Capability.WORK in held for held in TOKEN_CAPABILITIES.values())
    assert all(Capability.ADMIN not in held for held in TOKEN_CAPABILITIES.values())
    assert Capability.AUDIT in TOKEN_CAPABILITIES[TokenRole.REVIEWER]
    assert Capability.AUDIT not in TOKEN_CAPABILITIES[TokenRole.AGENT]


@pytest.mark.parametrize("who", ["alice", "bob", "charlie", "outsider"])
def test_console_and_api_agree_on_every_capability(request, team, other_team, who):
    user = request.getfixturevalue(who)
    access, caller = access_for(user), _caller(user)
    for team_id in (team.pk, other_team.pk):
        for capability in Capability:
            assert access.may(capability, team_id) == caller.may(capability, team_id), (
                who,
                team_id,
                capability,
            )


def test_staff_are_admins_of_every_team_in_both(team, other_team, django_user_model):
    root = django_user_model.objects.create_user("root", is_staff=True)
    access, caller = access_for(root), _caller(root)
    for team_id in (team.pk, other_team.pk):
        assert access.capabilities(team_id) == EVERY_TEAM_CAPABILITIES
        assert {c for c in Capability if caller.may(c, team_id)} == EVERY_TEAM_CAPABILITIES
    assert caller.team_ids(Capability.AUDIT) is None and access.ids_with(Role.ADMIN) is None


def test_console_roles_rank_as_before():
    access = Access(user_id=1, roles={1: Role.VIEWER, 2: Role.REVIEWER, 3: Role.ADMIN})
    assert [access.has(team_id, Role.REVIEWER) for team_id in (1, 2, 3, 4)] == [
        False,
        True,
        True,
        False,
    ]
    assert access.ids_with(Role.VIEWER) == [1, 2, 3]
    assert access.ids_with(Role.ADMIN) == [3]
    assert access.highest_role == Role.ADMIN
    assert Access(user_id=1, roles={1: Role.VIEWER, 2: Role.REVIEWER}).highest_role == (
        Role.REVIEWER
    )
    assert not Access(user_id=1, roles={1: Role.REVIEWER}).is_admin_anywhere


@pytest.mark.parametrize(
    ("reason", "token_role", "capabilities", "refused"),
    [
        (StopReason.TIMEOUT, TokenRole.AGENT, TOKEN_CAPABILITIES[TokenRole.AGENT], False),
        (StopReason.USER_STOP, TokenRole.AGENT, TOKEN_CAPABILITIES[TokenRole.AGENT], True),
        (StopReason.USER_STOP, TokenRole.REVIEWER, TOKEN_CAPABILITIES[TokenRole.REVIEWER], False),
        (StopReason.ADMIN_KILL, TokenRole.REVIEWER, TOKEN_CAPABILITIES[TokenRole.REVIEWER], True),
        (StopReason.ADMIN_KILL, None, ROLE_CAPABILITIES[Role.REVIEWER], True),
        (StopReason.ADMIN_KILL, None, ROLE_CAPABILITIES[Role.ADMIN], False),
    ],
)
def test_stop_reasons_by_holder(reason, token_role, capabilities, refused):
    refusal = stop_reason_refusal(reason, capabilities=capabilities, token_role=token_role)
    assert (refusal is not None) == refused
