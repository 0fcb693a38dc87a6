"""A decision offered on several pages posts to an endpoint of the page it is on: the page's
answer never depends on a hidden `from` field, and no view module imports a sibling view."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import console.views
from runs.actors import Actor
from tests.support.htmx import htmx
from tests.support.scenarios import handed_off, stopped_dirty

pytestmark = pytest.mark.django_db

# Helper modules every view may use; anything else under console.views is a page.
SHARED_VIEW_MODULES = {"console.views.common", "console.views.decisions"}


def test_the_packet_page_releases_and_discards_through_its_own_endpoint(as_reviewer, team, bob):
    run = stopped_dirty(team, by=Actor.for_user(bob))
    item = run.outbox_items.get()
    body = as_reviewer.get(f"/runs/{run.pk}/packets/{run.stop_epoch}/").content.decode()
    endpoint = f"/runs/{run.pk}/packet/outbox/{item.pk}/"
    assert f'action="{endpoint}release/"' in body and 'name="from"' not in body

    released = as_reviewer.post(f"{endpoint}release/", {}, **htmx("packet-frozen"))
    answer = released.content.decode()
    assert answer.lstrip().startswith('<section id="packet-frozen"')
    assert "released: it will be dispatched" in answer

    again = as_reviewer.post(f"{endpoint}discard/", {})  # no htmx: a message and a redirect
    assert again.status_code == 302 and again["Location"] == f"/runs/{run.pk}/packet/"
    assert as_reviewer.post(f"{endpoint}explode/", {}).status_code == 404


def test_the_inbox_decides_steering_through_its_own_endpoint(as_reviewer, team, bob):
    run = handed_off(team, by=Actor.for_user(bob))
    handoff, message = run.handoffs.get(), run.steering_messages.get()
    body = as_reviewer.get("/handoffs/").content.decode()
    endpoint = f"/runs/{run.pk}/handoff/steering/{message.pk}/decide/"
    assert f'action="{endpoint}"' in body and 'name="from"' not in body

    response = as_reviewer.post(endpoint, {"decision": "carry_over"}, **htmx())
    card = response.content.decode()
    assert card.lstrip().startswith(f'<article id="handoff-{handoff.pk}"')
    assert "Carried over to the next round." in card
    message.refresh_from_db()
    assert message.status == "carried_over"

    invalid = as_reviewer.post(endpoint, {"decision": "shout"})
    assert invalid.status_code == 302 and invalid["Location"] == "/handoffs/"


def test_no_view_module_imports_a_sibling_view():
    folder = Path(console.views.__file__).parent
    for path in folder.glob("*.py"):
        imported = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "console.views":
                    imported |= {f"console.views.{alias.name}" for alias in node.names}
                else:
                    imported.add(node.module)
            elif isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
        siblings = {
            name for name in imported if name.startswith("console.views.")
        } - SHARED_VIEW_MODULES
        assert not siblings, f"{path.name} imports {sorted(siblings)}"


def test_the_api_docs_page_has_no_inline_style(client):
    """The Content-Security-Policy allows no inline <style>: the Swagger page's few rules come
    from a file."""
    response = client.get("/api/docs/")
    body = response.content.decode()
    assert response.status_code == 200
    assert "<style" not in body
    assert "console/api_docs.css" in body
    assert "style-src 'self'" in response["Content-Security-Policy"]
