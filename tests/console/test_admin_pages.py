"""Admins only: the audit page (filters, CSV, ledger verification), API tokens, the stop quality
page for everyone, and the Django admin for every model with a read-only ledger."""

from __future__ import annotations

import csv
import io

import pytest
from django.apps import apps
from django.contrib import admin

from runs.actors import Actor
from runs.models import ApiToken, LedgerEntry, Run
from tests.support.htmx import htmx
from tests.support.scenarios import new_run, running, stopped_cleanly, stopped_dirty

pytestmark = pytest.mark.django_db


# ---------------------------------------------------------------- audit


def test_audit_is_for_admins(as_reviewer, as_viewer, as_admin):
    assert as_reviewer.get("/audit/").status_code == 403
    assert as_viewer.get("/audit.csv").status_code == 403
    assert as_admin.get("/audit/").status_code == 200


def test_audit_shows_who_stopped_what_when_and_why(as_admin, team, bob, other_team):
    run = stopped_cleanly(team, by=Actor.for_user(bob))
    foreign = stopped_cleanly(other_team)
    body = as_admin.get("/audit/", {"action": "run.stop_requested"}).content.decode()
    assert run.pk in body and "bob" in body and "user stop" in body and "pause" in body
    assert foreign.pk not in body  # another team's ledger is not this admin's
    only_bob = as_admin.get("/audit/", {"actor": "bob"}).context["rows"]
    assert {entry.action for entry in only_bob} == {"run.stop_requested"}
    by_reason = as_admin.get("/audit/", {"reason": "user_stop", "team": "acme"}).content.decode()
    assert run.pk in by_reason
    future = as_admin.get("/audit/", {"since": "2999-01-01T00:00"}).content.decode()
    assert "No ledger entries match" in future


def test_audit_region_fragment_and_paging(as_admin, team):
    for _ in range(120):
        new_run(team)
    fragment = as_admin.get("/audit/", **htmx("audit-region")).content.decode()
    assert fragment.lstrip().startswith('<section id="audit-region"') and "<html" not in fragment
    page = as_admin.get("/audit/")
    assert page.context["has_more"] and len(page.context["rows"]) == 100
    older = as_admin.get("/audit/", {"after": page.context["older_after"]}).context["rows"]
    assert len(older) == LedgerEntry.objects.count() - 100
    assert max(entry.pk for entry in older) < min(entry.pk for entry in page.context["rows"])


def test_audit_csv_export(as_admin, team, bob):
    run = stopped_cleanly(team, by=Actor.for_user(bob))
    response = as_admin.get("/audit.csv", {"run": run.pk})
    assert response.status_code == 200 and response["Content-Type"].startswith("text/csv")
    assert "attachment" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(b"".join(response.streaming_content).decode())))
    assert len(rows) == LedgerEntry.objects.filter(run=run).count()
    stop = next(row for row in rows if row["action"] == "run.stop_requested")
    assert stop["actor"] == "bob" and stop["reason"] == "user_stop" and stop["note"] == "pause"
    assert len(stop["hash"]) == 64


# ---------------------------------------------------------------- stop quality


def test_stop_quality_shows_the_five_figures(as_viewer, team, bob):
    stopped_cleanly(team, by=Actor.for_user(bob))
    stopped_dirty(team, by=Actor.for_user(bob))
    body = as_viewer.get("/quality/").content.decode()
    for title in (
        "Cancel → safe stop latency",
        "Side-effect leakage",
        "Late writes after stop",
        "Interruptions recovered cleanly",
        "Handoff completion",
    ):
        assert title in body
    assert "2 stops (1 clean, 1 dirty)" in body
    assert body.count("<svg") >= 3 and 'role="img"' in body
    assert "no leakage" in body


def test_stop_quality_custom_period_and_team(as_viewer, team):
    response = as_viewer.get(
        "/quality/",
        {"period": "custom", "since": "2020-01-01", "until": "2020-01-31", "team": "acme"},
        **htmx("quality-region"),
    )
    body = response.content.decode()
    assert response.status_code == 200 and body.lstrip().startswith('<section id="quality-region"')
    assert "2020-01-01 – 2020-01-31" in body and "0 stops" in body
    bad = as_viewer.get(
        "/quality/", {"period": "custom", "since": "2020-02-01", "until": "2020-01-01"}
    )
    assert bad.status_code == 200 and "start date is after the end date" in bad.content.decode()


# ---------------------------------------------------------------- tokens


def test_tokens_page_creates_a_token_shown_once_and_revokes(as_admin, as_reviewer, team):
    assert as_reviewer.get("/tokens/").status_code == 403
    created = as_admin.post("/tokens/", {"team": "acme", "name": "report-bot", "role": "agent"})
    # Post/redirect/get: refreshing the page that shows the token never posts the form again.
    assert created.status_code == 302 and created["Location"] == "/tokens/"
    shown = as_admin.get(created["Location"])
    body = shown.content.decode()
    assert shown.status_code == 200 and "Copy this token now" in body
    token = ApiToken.objects.get(name="report-bot")
    raw = shown.context["raw_token"]
    assert raw.startswith("ss_") and raw in body and token.token_hash != raw
    assert "no-store" in shown["Cache-Control"]
    # Never in a URL, and out of the session once shown: a refresh shows the list only.
    assert raw not in created["Location"]
    assert not any(raw in str(value) for value in as_admin.session.values())
    refreshed = as_admin.get("/tokens/")
    assert (
        raw not in refreshed.content.decode()
        and "Copy this token now" not in refreshed.content.decode()
    )
    assert ApiToken.objects.filter(name="report-bot").count() == 1
    duplicate = as_admin.post("/tokens/", {"team": "acme", "name": "report-bot", "role": "agent"})
    assert duplicate.status_code == 400 and "already has a token" in duplicate.content.decode()
    as_admin.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


# ---------------------------------------------------------------- Django admin


def test_every_model_has_an_admin(as_staff):
    for model in [
        *apps.get_app_config("runs").get_models(),
        *apps.get_app_config("handoff").get_models(),
    ]:
        assert model in admin.site._registry, model.__name__
        url = f"/admin/{model._meta.app_label}/{model._meta.model_name}/"
        assert as_staff.get(url).status_code == 200, url


def test_the_ledger_is_read_only_in_the_admin(as_staff, team):
    run = new_run(team)
    entry = LedgerEntry.objects.filter(run=run).first()
    model_admin = admin.site._registry[LedgerEntry]
    request = type("R", (), {"user": as_staff})()
    assert not model_admin.has_add_permission(request)
    assert not model_admin.has_change_permission(request, entry)
    assert not model_admin.has_delete_permission(request, entry)
    assert as_staff.get("/admin/runs/ledgerentry/add/").status_code == 403
    assert (
        as_staff.post(f"/admin/runs/ledgerentry/{entry.pk}/delete/", {"post": "yes"}).status_code
        == 403
    )
    change = as_staff.post(f"/admin/runs/ledgerentry/{entry.pk}/change/", {"action": "tampered"})
    assert change.status_code in (302, 403)
    entry.refresh_from_db()
    assert entry.action == "run.created"
    assert (
        as_staff.get(f"/admin/runs/ledgerentry/{entry.pk}/change/").status_code == 200
    )  # viewable


def test_admin_kill_action_uses_the_stop_service(as_staff, team):
    run, _lease = running(team)
    response = as_staff.post(
        "/admin/runs/run/", {"action": "admin_kill", "_selected_action": [run.pk]}
    )
    assert response.status_code == 302
    run = Run.objects.get(pk=run.pk)
    assert run.status == "cancel_requested" and run.stop_reason == "admin_kill"
    assert LedgerEntry.objects.filter(run=run, action="run.stop_requested", actor="root").exists()
