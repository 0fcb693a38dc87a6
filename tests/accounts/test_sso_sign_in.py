"""Signing in through a real OpenID provider (tests/support/oidc.py): the authorization code
flow with state, nonce and PKCE S256; users keyed by issuer + subject; IdP groups → team roles,
applied at every sign-in on mapped teams only and ledgered; RP-initiated logout; the 15-minute
re-check through the IdP."""

from __future__ import annotations

import base64
import hashlib
import time
from urllib.parse import parse_qs, urlsplit

import pytest
from django.contrib.auth import SESSION_KEY, get_user_model
from django.test import Client

from accounts.models import IdentityLink
from runs.models import LedgerEntry, Membership, Role, Team
from tests.support.oidc import CLIENT_ID, sign_in_through

User = get_user_model()


def _roles(user) -> dict[str, str]:
    return dict(Membership.objects.filter(user=user).values_list("team__slug", "role"))


def test_the_login_page_offers_passwords_only_without_an_idp(client, settings, db):
    settings.SAFESTOP_OIDC_ISSUER = ""
    page = client.get("/login/").content.decode()
    assert "Sign in with" not in page and 'name="password"' in page
    assert client.get("/login/sso/").status_code == 404


def test_an_issuer_switches_the_login_page_over(client, sso):
    page = client.get("/login/").content.decode()
    assert "Sign in with Example IdP" in page
    assert 'href="/login/sso/"' in page


def test_the_code_flow_signs_in_with_state_nonce_and_pkce(client, sso):
    sso.provider.set_user("sub-uma", preferred_username="uma", groups=["safestop-reviewers"])
    start = client.get("/login/sso/")
    query = parse_qs(urlsplit(start["Location"]).query)
    assert start["Location"].startswith(f"{sso.provider.url}/oauth2/authorize?")
    assert query["client_id"] == [CLIENT_ID]
    assert query["code_challenge_method"] == ["S256"] and len(query["code_challenge"][0]) == 43
    assert query["state"][0] and query["nonce"][0]

    back = sso.provider.authorize(start["Location"], "sub-uma")
    assert parse_qs(urlsplit(back).query)["state"] == query["state"]
    done = client.get(back.split("testserver", 1)[1])
    assert done.status_code == 302 and done["Location"] == "/home/"

    # PKCE: the verifier sent to the token endpoint is the one the challenge was made from.
    (token_request,) = sso.provider.token_requests
    verifier = token_request["code_verifier"]
    digest = hashlib.sha256(verifier.encode()).digest()
    assert base64.urlsafe_b64encode(digest).rstrip(b"=").decode() == query["code_challenge"][0]

    uma = User.objects.get(pk=client.session[SESSION_KEY])
    assert uma.username == "uma" and not uma.has_usable_password()
    link = IdentityLink.objects.get(user=uma)
    assert (link.issuer, link.subject) == (sso.provider.issuer, "sub-uma")
    assert _roles(uma) == {"acme": Role.REVIEWER}
    assert client.get("/").status_code == 200


def test_users_are_keyed_by_issuer_and_subject_never_by_email(client, sso):
    """Two subjects with one e-mail address are two people; a changed address is one."""
    sso.provider.set_user("sub-1", email="shared@example.org", groups=["safestop-reviewers"])
    sso.provider.set_user("sub-2", email="shared@example.org", groups=["globex-viewers"])
    sign_in_through(client, sso.provider, "sub-1")
    other = Client()
    sign_in_through(other, sso.provider, "sub-2")
    first = IdentityLink.objects.get(subject="sub-1").user
    second = IdentityLink.objects.get(subject="sub-2").user
    assert first.pk != second.pk
    assert _roles(first) == {"acme": Role.REVIEWER} and _roles(second) == {"globex": Role.VIEWER}

    sso.provider.set_user("sub-1", email="new@example.org", groups=["safestop-reviewers"])
    sign_in_through(Client(), sso.provider, "sub-1")
    assert IdentityLink.objects.get(subject="sub-1").user.pk == first.pk
    assert User.objects.get(pk=first.pk).email == "new@example.org"


def test_roles_follow_the_groups_at_every_sign_in_on_mapped_teams_only(client, sso):
    sso.provider.set_user("sub-ann", preferred_username="ann", groups=["safestop-admins"])
    sign_in_through(client, sso.provider, "sub-ann")
    ann = User.objects.get(username="ann")
    # A membership an admin made by hand, on a team no mapping names: never the IdP's business.
    Membership.objects.create(user=ann, team=Team.objects.create(slug="lab"), role=Role.ADMIN)
    assert _roles(ann) == {"acme": Role.ADMIN, "lab": Role.ADMIN}

    sso.provider.set_user(
        "sub-ann", preferred_username="ann", groups=["safestop-reviewers", "globex-viewers"]
    )
    sign_in_through(Client(), sso.provider, "sub-ann")
    assert _roles(ann) == {"acme": Role.REVIEWER, "globex": Role.VIEWER, "lab": Role.ADMIN}

    changes = list(
        LedgerEntry.objects.filter(action="membership.changed", payload__user="ann")
        .order_by("pk")
        .values_list("team_slug", "payload__previous", "payload__role")
    )
    assert changes == [
        ("acme", None, "admin"),
        ("acme", "admin", "reviewer"),
        ("globex", None, "viewer"),
    ]


def test_the_highest_role_of_several_mapped_groups_wins(client, sso):
    sso.provider.set_user("sub-h", groups=["safestop-reviewers", "safestop-admins"])
    sign_in_through(client, sso.provider, "sub-h")
    assert _roles(IdentityLink.objects.get(subject="sub-h").user) == {"acme": Role.ADMIN}


def test_a_person_in_no_mapped_group_is_refused_with_a_page(client, sso, caplog):
    sso.provider.set_user("sub-x", preferred_username="xavier", groups=["marketing"])
    answer = sign_in_through(client, sso.provider, "sub-x")
    assert answer.status_code == 403
    assert "none of your groups gives you a role" in answer.content.decode()
    assert SESSION_KEY not in client.session
    assert not User.objects.filter(username="xavier").exists()
    assert [r.getMessage() for r in caplog.records if "sso.refused" in r.getMessage()] == [
        "sso.refused reason=no_mapped_group detail=groups ['marketing'] map to no team"
    ]


def test_losing_every_mapped_group_takes_the_roles_away_and_refuses(client, sso):
    sso.provider.set_user("sub-l", preferred_username="leo", groups=["safestop-reviewers"])
    sign_in_through(client, sso.provider, "sub-l")
    leo = User.objects.get(username="leo")
    sso.provider.set_user("sub-l", preferred_username="leo", groups=[])
    assert sign_in_through(Client(), sso.provider, "sub-l").status_code == 403
    assert _roles(leo) == {}
    assert LedgerEntry.objects.filter(
        action="membership.changed", payload__user="leo", payload__role=None
    ).exists()


def test_the_seed_makes_the_table_and_leaves_admin_rows_alone(sso, settings):
    from accounts.models import GroupRole, GroupRoleSource
    from accounts.services import group_roles_seed

    group_roles_seed()
    assert GroupRole.objects.filter(source=GroupRoleSource.SETTINGS).count() == 3
    admin_row = GroupRole.objects.get(group="globex-viewers")
    admin_row.source, admin_row.role = GroupRoleSource.ADMIN, Role.REVIEWER
    admin_row.save()
    settings.SAFESTOP_OIDC_GROUP_ROLES = '{"safestop-admins": "acme:admin"}'
    result = group_roles_seed()
    assert result.removed == ["safestop-reviewers → acme:reviewer"]
    assert set(GroupRole.objects.values_list("group", "role")) == {
        ("safestop-admins", "admin"),
        ("globex-viewers", "reviewer"),
    }


def test_logout_also_ends_the_idp_session(client, sso):
    sso.provider.set_user("sub-o", groups=["safestop-reviewers"])
    sign_in_through(client, sso.provider, "sub-o")
    id_token = client.session["oidc_id_token"]
    out = client.post("/logout/")
    target = urlsplit(out["Location"])
    assert f"{target.scheme}://{target.netloc}{target.path}" == (
        f"{sso.provider.url}/oauth2/end_session"
    )
    query = parse_qs(target.query)
    assert query["id_token_hint"] == [id_token]
    assert query["post_logout_redirect_uri"] == ["http://testserver/login/"]
    assert SESSION_KEY not in client.session


def test_a_password_session_logs_out_locally(client, db):
    client.force_login(User.objects.create_superuser("root", password="pw-root"))
    assert client.post("/logout/")["Location"] == "/login/"
    assert SESSION_KEY not in client.session


def test_the_session_goes_back_through_the_idp_after_15_minutes(client, sso):
    sso.provider.set_user("sub-r", groups=["safestop-reviewers"])
    sign_in_through(client, sso.provider, "sub-r")
    assert client.get("/").status_code == 200
    session = client.session
    assert session["oidc_id_token_expiration"] == pytest.approx(time.time() + 900, abs=60)
    session["oidc_id_token_expiration"] = time.time() - 1
    session.save()

    again = client.get("/")
    assert again.status_code == 302
    query = parse_qs(urlsplit(again["Location"]).query)
    assert query["prompt"] == ["none"] and query["code_challenge_method"] == ["S256"]
    # htmx fragments reload the page instead of following a redirect they cannot
    fragment = client.get("/", headers={"HX-Request": "true"})
    assert fragment.status_code == 204 and fragment["HX-Refresh"] == "true"


def test_a_failed_recheck_ends_the_session(client, sso):
    sso.provider.set_user("sub-f", groups=["safestop-reviewers"])
    sign_in_through(client, sso.provider, "sub-f")
    session = client.session
    session["oidc_id_token_expiration"] = time.time() - 1
    session.save()
    start = client.get("/")
    state = parse_qs(urlsplit(start["Location"]).query)["state"][0]
    # The IdP answers the silent re-check with an error: the person is no longer signed in there.
    answer = client.get(f"/login/sso/callback/?error=login_required&state={state}")
    assert answer.status_code == 403 and SESSION_KEY not in client.session
