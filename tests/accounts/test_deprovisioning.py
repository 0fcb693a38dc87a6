"""Deprovisioning bites at once: a user deactivated through SCIM (`PATCH active=false`, in the
Entra ID and the Okta shapes) or by an admin loses every session and every open browser socket,
the reviewer tokens they made are revoked, their unfinished handoffs go back to the team's
queue, and the ledger says so. Plus the rest of the small SCIM endpoint: find, read, PUT,
reactivate, and its refusals."""

from __future__ import annotations

import json

import pytest
from channels.db import database_sync_to_async
from django.conf import settings as django_settings
from django.contrib.auth import SESSION_KEY, get_user_model
from django.test import Client

from accounts.models import SignedInSession
from handoff.models import Handoff
from runs.actors import Actor
from runs.models import ApiToken, LedgerEntry
from runs.tokens import api_token_create
from tests.support.live_sockets import ORIGIN, close_code
from tests.support.scenarios import handed_off, new_run

User = get_user_model()
TOKEN = "scim-test-token-0123456789"
ENTRA_DEACTIVATE = {
    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
    "Operations": [{"op": "Replace", "path": "active", "value": "False"}],
}
OKTA_DEACTIVATE = {
    "schemas": ["urn:ietf:params:scim:api:messages:2.0:PatchOp"],
    "Operations": [{"op": "replace", "value": {"active": False}}],
}


@pytest.fixture
def scim(settings, db) -> Client:
    settings.SAFESTOP_SCIM_TOKEN = TOKEN
    return Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")


def _patch(scim: Client, user, body) -> object:
    return scim.patch(
        f"/scim/v2/Users/{user.pk}", json.dumps(body), content_type="application/scim+json"
    )


def _signed_in(user, password: str) -> Client:
    """Through the login page, as a person would (the sign-in records the session)."""
    browser = Client()
    answer = browser.post("/login/", {"username": user.username, "password": password})
    assert answer.status_code == 302, answer.content[:300]
    return browser


@pytest.mark.parametrize("shape", [ENTRA_DEACTIVATE, OKTA_DEACTIVATE], ids=["entra", "okta"])
def test_scim_deactivation_ends_every_session_at_once(scim, bob, shape):
    laptop, phone = _signed_in(bob, "pw-bob"), _signed_in(bob, "pw-bob")
    assert SignedInSession.objects.filter(user=bob).count() == 2

    answer = _patch(scim, bob, shape)
    assert answer.status_code == 200 and answer.json()["active"] is False
    assert answer["Content-Type"] == "application/scim+json"
    for browser in (laptop, phone):
        assert browser.get("/")["Location"].startswith("/login/")
    store = __import__(django_settings.SESSION_ENGINE, fromlist=["SessionStore"]).SessionStore
    key = laptop.cookies[django_settings.SESSION_COOKIE_NAME].value
    assert not store().exists(key)


def test_deactivation_revokes_their_reviewer_tokens_and_returns_their_handoffs(
    scim, team, alice, bob, django_capture_on_commit_callbacks
):
    by_bob = Actor.for_user(bob)
    api_token_create(team_slug=team.slug, name="bob-script", role="reviewer", actor=by_bob)
    api_token_create(team_slug=team.slug, name="bob-agent", role="agent", actor=by_bob)
    api_token_create(
        team_slug=team.slug, name="alice-script", role="reviewer", actor=Actor.for_user(alice)
    )
    handoff = handed_off(team, by=by_bob).handoffs.get()
    Handoff.objects.filter(pk=handoff.pk).update(status="accepted")
    assert handoff.assignee_id == bob.pk

    with django_capture_on_commit_callbacks(execute=True):
        assert _patch(scim, bob, ENTRA_DEACTIVATE).status_code == 200

    revoked = dict(ApiToken.objects.values_list("name", "revoked_at"))
    assert revoked["bob-script"] is not None
    assert revoked["bob-agent"] is None and revoked["alice-script"] is None
    handoff.refresh_from_db()
    assert (handoff.assignee_id, handoff.status) == (None, "open")
    entry = LedgerEntry.objects.get(action="user.deactivated")
    assert entry.payload["via"] == "scim" and entry.actor == "scim"
    assert entry.payload["tokens_revoked"] == ["acme/bob-script"]
    assert entry.payload["handoffs_returned"] == [handoff.pk]
    assert LedgerEntry.objects.filter(
        action="handoff.assigned", payload__previous="bob", payload__assignee=None
    ).exists()


def test_deactivating_twice_writes_nothing_the_second_time(scim, bob):
    _patch(scim, bob, OKTA_DEACTIVATE)
    _patch(scim, bob, OKTA_DEACTIVATE)
    assert LedgerEntry.objects.filter(action="user.deactivated").count() == 1


def test_reactivation_and_put(scim, bob):
    _patch(scim, bob, ENTRA_DEACTIVATE)
    back = _patch(scim, bob, {"Operations": [{"op": "Replace", "path": "active", "value": "True"}]})
    assert back.json()["active"] is True
    assert LedgerEntry.objects.filter(action="user.reactivated").count() == 1
    put = scim.put(
        f"/scim/v2/Users/{bob.pk}",
        json.dumps({"schemas": ["urn:ietf:params:scim:schemas:core:2.0:User"], "active": False}),
        content_type="application/scim+json",
    )
    assert put.status_code == 200 and put.json()["active"] is False
    assert not User.objects.get(pk=bob.pk).is_active


def test_find_and_read_a_user(scim, bob, charlie):
    found = scim.get("/scim/v2/Users", {"filter": 'userName eq "BOB"'}).json()
    assert found["totalResults"] == 1
    (resource,) = found["Resources"]
    assert resource["id"] == str(bob.pk) and resource["userName"] == "bob"
    assert resource["active"] is True
    assert scim.get(f"/scim/v2/Users/{bob.pk}").json()["userName"] == "bob"
    nobody = scim.get("/scim/v2/Users", {"filter": 'userName eq "nobody"'}).json()
    assert nobody["totalResults"] == 0 and nobody["Resources"] == []


@pytest.mark.parametrize(
    ("body", "scim_type"),
    [
        ({"Operations": [{"op": "Replace", "path": "active", "value": "maybe"}]}, "invalidValue"),
        ({"Operations": []}, "invalidSyntax"),
        ({"Operations": [{"op": "move", "path": "active", "value": False}]}, "invalidSyntax"),
        ({"Operations": [{"op": "replace", "value": "active=false"}]}, "invalidValue"),
        ([1, 2], "invalidSyntax"),
    ],
)
def test_bad_patches_are_scim_errors(scim, bob, body, scim_type):
    answer = _patch(scim, bob, body)
    assert answer.status_code == 400
    assert answer.json()["scimType"] == scim_type
    assert User.objects.get(pk=bob.pk).is_active


def test_scim_refusals(scim, settings, bob):
    assert Client().get("/scim/v2/Users").status_code == 401
    wrong = Client(HTTP_AUTHORIZATION="Bearer nope")
    assert wrong.patch(f"/scim/v2/Users/{bob.pk}", "{}").status_code == 401
    assert scim.get("/scim/v2/Users", {"filter": 'emails co "x"'}).json()["scimType"] == (
        "invalidFilter"
    )
    assert scim.get("/scim/v2/Users/999999").status_code == 404
    assert scim.get("/scim/v2/Users/abc").status_code == 404
    not_json = scim.patch(f"/scim/v2/Users/{bob.pk}", "{oops", content_type="application/json")
    assert not_json.status_code == 400
    assert scim.post("/scim/v2/Users", "{}", content_type="application/json").status_code == 405
    settings.SAFESTOP_SCIM_TOKEN = ""
    assert scim.get("/scim/v2/Users").status_code == 404


def test_an_admin_unticking_active_deprovisions_too(bob, db):
    root = User.objects.create_superuser("root", password="pw-root")
    phone = _signed_in(bob, "pw-bob")
    admin = Client()
    admin.force_login(root)
    page = admin.get(f"/admin/auth/user/{bob.pk}/change/")
    assert page.status_code == 200
    form = {
        "username": "bob",
        "is_staff": "",
        "is_superuser": "",
        "last_login_0": "",
        "last_login_1": "",
        "date_joined_0": "2026-01-01",
        "date_joined_1": "00:00:00",
        "initial-date_joined_0": "2026-01-01",
        "initial-date_joined_1": "00:00:00",
    }  # is_active left out: unticked
    saved = admin.post(f"/admin/auth/user/{bob.pk}/change/", form)
    assert saved.status_code == 302, saved.content.decode()[:2000]
    assert not User.objects.get(pk=bob.pk).is_active
    assert phone.get("/")["Location"].startswith("/login/")
    entry = LedgerEntry.objects.get(action="user.deactivated")
    assert entry.payload["via"] == "admin" and entry.actor == "root"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("fresh_channel_layer")
async def test_open_browser_sockets_close_when_scim_deactivates(settings, team, bob):
    """The sockets learn of it on commit (`access.changed`) and find the session gone: 4401,
    which makes the page reload onto the sign-in page (static/console/console.js)."""
    from channels.testing import WebsocketCommunicator

    from console.asgi import application

    settings.SAFESTOP_SCIM_TOKEN = TOKEN
    settings.SAFESTOP_WS_ACCESS_RECHECK_SECONDS = 0  # the message alone must do it
    run = await database_sync_to_async(new_run)(team)
    browser = await database_sync_to_async(_signed_in)(bob, "pw-bob")
    cookie = browser.cookies[django_settings.SESSION_COOKIE_NAME].value
    sockets = []
    for path in ("/ws/runs/", f"/ws/runs/{run.pk}/"):
        socket = WebsocketCommunicator(
            application,
            path,
            headers=[
                (b"origin", ORIGIN.encode()),
                (b"cookie", f"{django_settings.SESSION_COOKIE_NAME}={cookie}".encode()),
            ],
        )
        connected, _ = await socket.connect()
        assert connected
        sockets.append(socket)

    scim = Client(HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    answer = await database_sync_to_async(_patch)(scim, bob, ENTRA_DEACTIVATE)
    assert answer.status_code == 200
    for socket in sockets:
        code, _frames = await close_code(socket, timeout=1)
        assert code == 4401
        await socket.disconnect()
    assert SESSION_KEY not in await database_sync_to_async(lambda: browser.session.keys())()
