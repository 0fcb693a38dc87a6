"""`usage` events (DESIGN §13): priced on arrival, kept per call, totalled on the run."""

from __future__ import annotations

from decimal import Decimal

import genai_prices
import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from runs import services
from runs.models import EventReceipt, Run, Usage
from tests.support.api import stop, url
from tests.support.scenarios import SYSTEM, make_running, reload

pytestmark = pytest.mark.django_db


def usage(event_id: str, **fields):
    return {"event_id": event_id, "type": "usage", **fields}


def send(api, run, token, *events, epoch: int = 1):
    response = api.post(url(run, "events/"), {"epoch": epoch, "events": list(events)}, token)
    assert response.status_code == 200, response.content
    return [(a["status"], a.get("code"), a.get("detail")) for a in response.json()["results"]]


def table_price(model: str, input_tokens: int, output_tokens: int, **extra) -> Decimal:
    return Decimal(
        genai_prices.calc_price(
            genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens, **extra),
            model_ref=model,
        ).total_price
    )


def test_a_known_model_is_priced_from_the_table_with_its_version(api, team, agent_token):
    run, _ = make_running(team)
    answers = send(
        api,
        run,
        agent_token,
        usage(
            "u1",
            model="gpt-4o",
            provider="openai",
            input_tokens=1000,
            output_tokens=100,
            cache_read_tokens=200,
            step_key="plan",
        ),
    )
    assert answers == [("accepted", None, None)]
    row = Usage.objects.get(run=run)
    expected = table_price("gpt-4o", 1000, 100, cache_read_tokens=200)
    assert expected > 0
    assert row.cost_usd == expected
    assert (row.price_source, row.price_version) == (
        "table",
        f"genai-prices {genai_prices.__version__}",
    )
    assert (row.model, row.provider, row.step_key, row.epoch) == ("gpt-4o", "openai", "plan", 1)
    assert (row.input_tokens, row.output_tokens, row.cache_read_tokens) == (1000, 100, 200)


def test_the_providers_own_cost_wins_over_the_table(api, team, agent_token):
    run, _ = make_running(team)
    send(
        api,
        run,
        agent_token,
        usage("u1", model="gpt-4o", input_tokens=1000, output_tokens=100, cost_usd=0.5),
        usage("u2", model="gpt-4o", input_tokens=10, output_tokens=1, cost_usd="0.0000001"),
    )
    rows = {row.event_id: row for row in Usage.objects.filter(run=run)}
    assert (rows["u1"].cost_usd, rows["u1"].price_source) == (Decimal("0.5"), "provider")
    assert rows["u1"].price_version == ""
    assert rows["u2"].cost_usd == Decimal("0.0000001")
    assert reload(run).cost_usd == Decimal("0.5000001")


def test_an_unknown_model_is_unpriced_and_counted_never_zero(api, team, agent_token):
    run, _ = make_running(team)
    send(
        api,
        run,
        agent_token,
        usage("u1", model="acme-llm-9000", input_tokens=300, output_tokens=50),
        usage("u2", model="gpt-4o", provider="no-such-cloud", input_tokens=7, output_tokens=3),
        usage("u3", model="gpt-4o-mini", input_tokens=1000, output_tokens=10),
    )
    rows = {row.event_id: row for row in Usage.objects.filter(run=run)}
    for event_id in ("u1", "u2"):
        assert rows[event_id].cost_usd is None
        assert rows[event_id].price_source == "unpriced"
    run = reload(run)
    assert run.unpriced_tokens == 350 + 10
    assert run.cost_usd == table_price("gpt-4o-mini", 1000, 10)
    assert (run.input_tokens, run.output_tokens) == (1307, 63)


def test_a_retried_usage_event_is_a_duplicate_and_counted_once(api, team, agent_token):
    run, _ = make_running(team)
    event = usage("u1", model="gpt-4o", input_tokens=1000, output_tokens=100, cost_usd=0.25)
    assert send(api, run, agent_token, event, event) == [
        ("accepted", None, None),
        ("duplicate", None, None),
    ]
    assert send(api, run, agent_token, event) == [("duplicate", None, None)]
    assert Usage.objects.filter(run=run).count() == 1
    run = reload(run)
    assert (run.cost_usd, run.input_tokens, run.output_tokens) == (Decimal("0.25"), 1000, 100)


BAD_USAGE = [
    ({"input_tokens": -1, "output_tokens": 1}, "input_tokens must not be negative"),
    ({"input_tokens": 1, "output_tokens": 10**12}, "output_tokens 1000000000000 is more than"),
    ({"input_tokens": 1.5, "output_tokens": 1}, "input_tokens must be a whole number"),
    ({"input_tokens": True, "output_tokens": 1}, "input_tokens must be a whole number"),
    ({"input_tokens": "12", "output_tokens": 1}, "input_tokens must be a whole number"),
    ({"output_tokens": 1}, "usage needs input_tokens"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": "NaN"}, "cost_usd must be a finite"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": "Infinity"}, "cost_usd must be a finite"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": "-inf"}, "cost_usd must be a finite"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": -0.01}, "cost_usd must not be negative"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": 1e9}, "more than one call can cost"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": "cheap"}, "cost_usd must be a number"),
    ({"input_tokens": 1, "output_tokens": 1, "cost_usd": [1]}, "cost_usd must be a number"),
    (
        {"input_tokens": 10, "output_tokens": 1, "cache_read_tokens": 11},
        "cache_read_tokens + cache_write_tokens exceed input_tokens",
    ),
]


@pytest.mark.parametrize(("fields", "detail"), BAD_USAGE)
def test_bad_usage_is_rejected_alone_and_nothing_is_kept(api, team, agent_token, fields, detail):
    run, _ = make_running(team)
    answers = send(
        api,
        run,
        agent_token,
        usage("bad", model="gpt-4o", **fields),
        usage("good", model="gpt-4o", input_tokens=5, output_tokens=5, cost_usd=0.01),
    )
    assert answers[0][:2] == ("rejected", "invalid")
    assert detail in answers[0][2]
    assert answers[1] == ("accepted", None, None)
    assert list(Usage.objects.filter(run=run).values_list("event_id", flat=True)) == ["good"]
    run = reload(run)
    assert (run.cost_usd, run.input_tokens, run.output_tokens, run.unpriced_tokens) == (
        Decimal("0.01"),
        5,
        5,
        0,
    )
    assert EventReceipt.objects.get(run=run, event_id="bad").outcome == "rejected"


@pytest.mark.parametrize(
    ("fields", "detail"),
    [
        ({"cost_usd": 0.1}, "cost_usd needs a model"),
        ({}, "usage needs a model"),
        ({"model": "m" * 10_000}, "model is longer than 200 characters"),
        ({"model": "gpt-4o", "provider": "p" * 101}, "provider is longer than 100 characters"),
        ({"model": 42}, "model must be a string"),
        ({"model": "gpt-4o", "step_key": "s" * 10_000}, "step_key is longer than 120"),
    ],
)
def test_a_model_is_required_and_bounded(api, team, agent_token, fields, detail):
    run, _ = make_running(team)
    answers = send(api, run, agent_token, usage("u", input_tokens=1, output_tokens=1, **fields))
    assert answers[0][:2] == ("rejected", "invalid")
    assert detail in answers[0][2]
    assert not Usage.objects.filter(run=run).exists()


def test_nan_in_the_body_is_a_400_for_the_batch_and_writes_nothing(api, team, agent_token):
    run, _ = make_running(team)
    raw = (
        '{"epoch": 1, "events": [{"event_id": "u", "type": "usage", "model": "gpt-4o", '
        '"input_tokens": 1, "output_tokens": 1, "cost_usd": NaN}]}'
    )
    response = api.post(url(run, "events/"), raw=raw, token=agent_token)
    assert response.status_code == 400
    assert response.json()["error"] == "parse_error"
    assert not Usage.objects.filter(run=run).exists()
    assert not EventReceipt.objects.filter(run=run).exists()


def test_the_drf_path_answers_usage_the_same(api, team, agent_token):
    """A batch the fast path hands to DRF (here: an event with `step_seq`) prices usage alike."""
    run, _ = make_running(team)
    answers = send(
        api,
        run,
        agent_token,
        {"event_id": "c", "type": "checkpoint.saved", "label": "c1", "step_seq": 1},
        usage("u1", model="gpt-4o", input_tokens=1000, output_tokens=100),
        usage("u2", model="gpt-4o", input_tokens=-1, output_tokens=100),
    )
    assert [answer[:2] for answer in answers] == [
        ("accepted", None),
        ("accepted", None),
        ("rejected", "invalid"),
    ]
    assert reload(run).cost_usd == table_price("gpt-4o", 1000, 100)


def test_usage_reported_after_a_stop_is_kept_as_a_fact(api, team, agent_token):
    run, _ = make_running(team)
    stop(run)
    answers = send(
        api, run, agent_token, usage("late", model="gpt-4o", input_tokens=10, output_tokens=10)
    )
    assert answers == [("accepted", None, None)]
    assert Usage.objects.get(run=run).epoch == 1
    assert reload(run).stop_epoch == 2


def test_the_run_shows_cost_and_tokens_in_the_api(api, team, agent_token):
    run, _ = make_running(team)
    send(
        api,
        run,
        agent_token,
        usage("u1", model="gpt-4o", input_tokens=1000, output_tokens=100, cost_usd=0.125),
        usage("u2", model="acme-llm-9000", input_tokens=40, output_tokens=2),
    )
    detail = api.get(url(run), agent_token).json()
    assert detail["cost_usd"] == 0.125
    assert detail["tokens"] == {"input": 1040, "output": 102, "total": 1142}
    assert detail["unpriced_tokens"] == 42
    listed = {item["id"]: item for item in api.get("/api/v1/runs/", agent_token).json()["results"]}
    assert listed[run.pk]["cost_usd"] == 0.125
    assert listed[run.pk]["unpriced_tokens"] == 42


def test_a_run_with_no_usage_costs_zero_with_nothing_unpriced(api, team, agent_token):
    run, _ = make_running(team)
    detail = api.get(url(run), agent_token).json()
    assert (detail["cost_usd"], detail["unpriced_tokens"]) == (0, 0)
    assert detail["tokens"] == {"input": 0, "output": 0, "total": 0}
    assert Run.objects.get(pk=run.pk).cost_usd == 0


def test_a_usage_batch_costs_the_same_statements_whatever_its_size(team):
    """The usage rows go in the batch's one multi-row INSERT and the totals in its one run
    UPDATE: 100 calls cost no more statements than 1 (no round trip per event)."""

    def statements(run, count: int) -> int:
        events = [
            usage(f"{run.pk}-{n}", model="gpt-4o", input_tokens=10, output_tokens=1)
            for n in range(count)
        ]
        with CaptureQueriesContext(connection) as queries:
            services.events_ingest(run_id=run.pk, epoch=1, events=events, actor=SYSTEM)
        return len(queries)

    one, _ = make_running(team)
    hundred, _ = make_running(team)
    statements(make_running(team)[0], 1)  # the price table loads once per process
    assert statements(hundred, 100) == statements(one, 1)
    assert reload(hundred).input_tokens == 1000


@pytest.mark.parametrize(
    "literal",
    [
        '"input_tokens": 1e400, "output_tokens": 1',
        '"input_tokens": 1, "output_tokens": 1, "cost_usd": -1e400',
    ],
)
def test_a_number_too_large_to_be_finite_is_a_400_for_the_batch(api, team, agent_token, literal):
    """1e400 is infinity once parsed: refused like NaN, by the parser, before anything runs."""
    run, _ = make_running(team)
    raw = (
        '{"epoch": 1, "events": [{"event_id": "bad", "type": "usage", "model": "gpt-4o", '
        + literal
        + "}]}"
    )
    response = api.post(url(run, "events/"), raw=raw, token=agent_token)
    assert response.status_code == 400
    assert response.json()["error"] == "parse_error"
    assert not Usage.objects.filter(run=run).exists()
    assert not EventReceipt.objects.filter(run=run).exists()


def test_a_400_digit_token_count_is_refused_alone(api, team, agent_token):
    run, _ = make_running(team)
    raw = (
        '{"epoch": 1, "events": [{"event_id": "bad", "type": "usage", "model": "gpt-4o", '
        '"input_tokens": 1' + "0" * 400 + ', "output_tokens": 1}, {"event_id": "good", '
        '"type": "usage", "model": "gpt-4o", "input_tokens": 2, "output_tokens": 2, '
        '"cost_usd": 0.5}]}'
    )
    response = api.post(url(run, "events/"), raw=raw, token=agent_token)
    assert response.status_code == 200, response.content
    bad, good = response.json()["results"]
    assert (bad["status"], bad["code"]) == ("rejected", "invalid")
    assert "is more than one call can use" in bad["detail"]
    assert good["status"] == "accepted"
    assert list(Usage.objects.filter(run=run).values_list("event_id", flat=True)) == ["good"]
    assert reload(run).cost_usd == Decimal("0.5")


def test_the_drf_path_refuses_a_10000_character_model_per_event(api, team, agent_token):
    run, _ = make_running(team)
    answers = send(
        api,
        run,
        agent_token,
        {"event_id": "c", "type": "checkpoint.saved", "label": "c1", "step_seq": 1},
        usage("u1", model="m" * 10_000, input_tokens=1, output_tokens=1),
    )
    assert answers[0][:2] == ("accepted", None)
    assert answers[1][:2] == ("rejected", "invalid")
    assert "model is longer than 200 characters" in answers[1][2]
    assert not Usage.objects.filter(run=run).exists()
