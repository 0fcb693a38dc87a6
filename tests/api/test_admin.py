"""Tokens are revocable in the admin; denials are readable there."""

from __future__ import annotations

import pytest

from api.models import Denial
from runs.models import LedgerEntry


@pytest.mark.django_db
def test_an_admin_revokes_a_token_and_it_stops_working(api, client, agent_token, django_user_model):
    root = django_user_model.objects.create_superuser("root", password="pw")
    client.force_login(root)
    response = client.post(
        "/admin/runs/apitoken/", {"action": "revoke", "_selected_action": [agent_token.token.pk]}
    )
    assert response.status_code == 302
    agent_token.token.refresh_from_db()
    assert agent_token.token.revoked_at is not None
    assert LedgerEntry.objects.filter(action="token.revoked", actor="root").exists()
    client.logout()
    assert api.get("/api/v1/runs/", agent_token).status_code == 401


@pytest.mark.django_db
def test_the_admin_lists_tokens_without_their_hash_and_denials(
    api, client, agent_token, django_user_model
):
    api.client.get("/api/v1/runs/", HTTP_AUTHORIZATION="Bearer ss_nope")
    assert Denial.objects.count() == 1
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    tokens = client.get(f"/admin/runs/apitoken/{agent_token.token.pk}/change/")
    assert tokens.status_code == 200
    assert agent_token.token.token_hash not in tokens.content.decode()
    assert client.get("/admin/runs_api/denial/").status_code == 200


@pytest.mark.django_db
def test_the_admin_names_ledger_entries_in_english(client, django_user_model):
    client.force_login(django_user_model.objects.create_superuser("root", password="pw"))
    index = client.get("/admin/").content.decode()
    assert "Ledger entries" in index and "Ledger entrys" not in index
    changelist = client.get("/admin/runs/ledgerentry/").content.decode()
    assert "ledger entries" in changelist.lower() and "entrys" not in changelist
