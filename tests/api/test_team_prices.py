"""A team's own prices (DESIGN §13), used before the price table; `manage.py reprice` shows what
the current table and prices would change in stored costs and writes only with --write."""

from __future__ import annotations

from decimal import Decimal
from io import StringIO

import genai_prices
import pytest
from django.core.management import CommandError, call_command

from runs import services
from runs.actors import Actor
from runs.errors import InvalidInput
from runs.models import LedgerEntry, Run, TeamPrice, Usage
from tests.support.api import url
from tests.support.scenarios import make_running

pytestmark = pytest.mark.django_db

ADMIN = Actor.system("test-admin")


def send(api, run, token, *events):
    response = api.post(url(run, "events/"), {"epoch": 1, "events": list(events)}, token)
    assert response.status_code == 200, response.content
    return [(a["status"], a.get("code")) for a in response.json()["results"]]


def usage(event_id: str, model: str, **fields):
    return {
        "event_id": event_id,
        "type": "usage",
        "model": model,
        "input_tokens": 1_000_000,
        "output_tokens": 500_000,
        **fields,
    }


def test_a_team_price_prices_a_model_the_table_lacks_and_the_row_names_it(api, team, agent_token):
    price = services.team_price_set(
        team_id=team.pk,
        actor=ADMIN,
        model="qwen-max",
        input_usd_per_mtok="1.6",
        output_usd_per_mtok="6.4",
    )
    run, _ = make_running(team)
    send(api, run, agent_token, usage("u1", "qwen-max"), usage("u2", "doubao-pro"))
    rows = {row.model: row for row in Usage.objects.filter(run=run)}
    assert rows["qwen-max"].cost_usd == Decimal("1.6") + Decimal("3.2")
    assert (rows["qwen-max"].price_source, rows["qwen-max"].price_version) == (
        "team",
        f"team:{price.pk}:v1",
    )
    # doubao-pro has no team price and is not in the table: unpriced, never $0.
    assert (rows["doubao-pro"].cost_usd, rows["doubao-pro"].price_source) == (None, "unpriced")
    assert Run.objects.get(pk=run.pk).cost_usd == Decimal("4.8")


def test_a_team_price_comes_before_the_table_and_a_providers_price_before_a_blank_one(
    api, team, agent_token
):
    services.team_price_set(
        team_id=team.pk, actor=ADMIN, model="gpt-4o", input_usd_per_mtok=1, output_usd_per_mtok=2
    )
    services.team_price_set(
        team_id=team.pk,
        actor=ADMIN,
        model="gpt-4o",
        provider="azure",
        input_usd_per_mtok=3,
        output_usd_per_mtok=4,
        cache_read_usd_per_mtok="0.5",
    )
    run, _ = make_running(team)
    send(
        api,
        run,
        agent_token,
        usage("any", "gpt-4o"),
        usage("azure", "gpt-4o", provider="azure", cache_read_tokens=400_000),
        usage("own", "gpt-4o", cost_usd=0.01),  # the provider's own figure still wins
    )
    rows = {row.event_id: row for row in Usage.objects.filter(run=run)}
    assert rows["any"].cost_usd == Decimal(1 + 1)
    # 600k plain input at 3, 400k cached at 0.5, 500k output at 4
    assert rows["azure"].cost_usd == Decimal("1.8") + Decimal("0.2") + Decimal("2")
    assert (rows["own"].cost_usd, rows["own"].price_source) == (Decimal("0.01"), "provider")


def test_a_changed_price_bumps_its_version_and_is_ledgered(team):
    price = services.team_price_set(
        team_id=team.pk,
        actor=ADMIN,
        model="doubao-pro",
        input_usd_per_mtok=1,
        output_usd_per_mtok=1,
    )
    again = services.team_price_set(
        team_id=team.pk,
        actor=ADMIN,
        model="doubao-pro",
        input_usd_per_mtok=1,
        output_usd_per_mtok=1,
    )
    assert again.version == 1  # nothing changed: nothing written
    changed = services.team_price_set(
        team_id=team.pk,
        actor=ADMIN,
        model="doubao-pro",
        input_usd_per_mtok=2,
        output_usd_per_mtok=1,
    )
    assert (changed.pk, changed.version) == (price.pk, 2)
    entries = LedgerEntry.objects.filter(action="team_price.changed").order_by("pk")
    assert [entry.payload["after"]["version"] for entry in entries] == [1, 2]
    assert entries[1].payload["before"]["input_usd_per_mtok"] == "1.000000"
    services.team_price_delete(price_id=price.pk, actor=ADMIN)
    assert LedgerEntry.objects.filter(action="team_price.deleted").count() == 1
    assert not TeamPrice.objects.exists()


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"model": "", "input_usd_per_mtok": 1, "output_usd_per_mtok": 1}, "model is required"),
        ({"model": "m" * 201, "input_usd_per_mtok": 1, "output_usd_per_mtok": 1}, "longer than"),
        ({"model": "x", "input_usd_per_mtok": -1, "output_usd_per_mtok": 1}, "more than 0"),
        ({"model": "x", "input_usd_per_mtok": "NaN", "output_usd_per_mtok": 1}, "finite"),
        ({"model": "x", "input_usd_per_mtok": 1}, "output_usd_per_mtok is required"),
    ],
)
def test_a_bad_team_price_is_refused_naming_the_field(team, fields, message):
    with pytest.raises(InvalidInput, match=message):
        services.team_price_set(team_id=team.pk, actor=ADMIN, **fields)
    assert not TeamPrice.objects.exists()


def reprice(*args: str) -> str:
    out = StringIO()
    call_command("reprice", *args, stdout=out)
    return out.getvalue()


def test_reprice_dry_run_shows_changes_and_writes_nothing_write_writes_and_ledgers(
    api, team, agent_token
):
    run, _ = make_running(team)
    send(api, run, agent_token, usage("u1", "qwen-max"), usage("u2", "gpt-4o"))
    send(api, run, agent_token, usage("u3", "gpt-4o", cost_usd=5))
    stored = {row.event_id: (row.cost_usd, row.price_version) for row in Usage.objects.all()}
    # Nothing changed since: nothing to do.
    assert "no stored cost would change" in reprice("--dry-run")
    # The team prices qwen-max now; and a row priced by an older table (as if the package
    # was updated since) keeps its cost until someone writes the repricing.
    services.team_price_set(
        team_id=team.pk, actor=ADMIN, model="qwen-max", input_usd_per_mtok=2, output_usd_per_mtok=2
    )
    Usage.objects.filter(event_id="u2").update(
        cost_usd=Decimal("9"), price_version="genai-prices 0.0.1"
    )
    Run.objects.filter(pk=run.pk).update(cost_usd=Decimal(9 + 5))
    shown = reprice("--dry-run")
    assert "qwen-max" in shown and "1 unpriced → priced" in shown
    assert "gpt-4o" in shown and "9.000000" in shown
    assert "2 rows in 1 runs would change (dry run" in shown
    assert Usage.objects.get(event_id="u1").cost_usd is None  # the dry run wrote nothing
    assert Usage.objects.get(event_id="u2").cost_usd == Decimal(9)
    assert not LedgerEntry.objects.filter(action="usage.repriced").exists()

    assert "2 rows in 1 runs repriced" in reprice("--write")
    rows = {row.event_id: row for row in Usage.objects.all()}
    assert rows["u1"].cost_usd == Decimal(3) and rows["u1"].price_source == "team"
    assert rows["u2"].cost_usd == stored["u2"][0]
    assert rows["u2"].price_version == f"genai-prices {genai_prices.__version__}"
    assert rows["u3"].cost_usd == Decimal(5)  # provider-reported: never repriced
    run = Run.objects.get(pk=run.pk)
    assert run.cost_usd == Decimal(3) + stored["u2"][0] + Decimal(5)
    assert run.unpriced_tokens == 0
    entry = LedgerEntry.objects.get(action="usage.repriced")
    assert {row["event_id"] for row in entry.payload["rows"]} == {"u1", "u2"}
    assert "no stored cost would change" in reprice("--dry-run")


def test_reprice_needs_an_explicit_mode(team):
    with pytest.raises(CommandError):
        call_command("reprice")
