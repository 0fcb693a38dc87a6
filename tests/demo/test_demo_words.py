"""The demo's agents write in the demo's language: every title, step name and summary the
scenarios write has its Simplified Chinese template, with the same fields."""

from __future__ import annotations

import io
import re
import string
from pathlib import Path
from typing import Any

import pytest

from console.demo.words import ZH_HANS, words

SCENARIOS = Path(__file__).resolve().parents[2] / "console" / "demo" / "scenarios.py"
CJK = re.compile(r"[\u4e00-\u9fff]")


def _literal(text: str) -> str:
    return text.encode("latin-1", "backslashreplace").decode("unicode_escape")


def _written_templates() -> list[str]:
    source = SCENARIOS.read_text(encoding="utf-8")
    translated = re.findall(r'ctx\.t\(\s*"((?:[^"\\]|\\.)*)"', source)
    steps = re.findall(r'Step\(\s*"\w+",\s*"((?:[^"\\]|\\.)*)"', source, re.S)
    return sorted({_literal(text) for text in translated + steps})


def _fields(template: str) -> set[str]:
    return {name for _text, name, _spec, _conv in string.Formatter().parse(template) if name}


def test_the_scenarios_were_read() -> None:
    found = _written_templates()
    assert "Refund order #{order}" in found and "Watch the canary" in found


@pytest.mark.parametrize("template", _written_templates())
def test_every_text_an_agent_writes_has_its_chinese(template: str) -> None:
    assert template in ZH_HANS, template
    chinese = ZH_HANS[template]
    assert CJK.search(chinese) and _fields(chinese) == _fields(template), chinese


def test_the_demo_language_chooses_the_words() -> None:
    assert words("en", "Refund order #{order}", order=1042) == "Refund order #1042"
    assert words("zh-hans", "Refund order #{order}", order=1042) == "为订单 #1042 退款"
    assert words("zh-hans", "not a demo text {x}", x=1) == "not a demo text 1"


def test_a_scenario_writes_in_the_simulators_language() -> None:
    from types import SimpleNamespace

    from console.demo.scenarios import Context

    sim = SimpleNamespace(config=SimpleNamespace(language="zh-hans"))
    context = Context(sim=sim, kind="refund", team="payments", worker_id="w1")  # type: ignore[arg-type]
    assert context.t("Refund order #{order}", order=7) == "为订单 #7 退款"


# --------------------------------------------------------------------------------------------
# a zh-hans demo, seeded and run: nothing a reader sees is English prose

SOURCES = [SCENARIOS.parent / name for name in ("scenarios.py", "simulator.py")]
# A word is English prose unless it is part of an identifier (an id, a tool, a service, a
# version, an address: anything with a digit, `_`, `.`, `-`, `@`, `/`, `:`, `#` or `%`).
IDENTIFIER = re.compile(r"\S*(?:\d|[_.@/:#%-](?=\S))\S*")
WORD = re.compile(r"[A-Za-z]{3,}")
KEPT_IN_ENGLISH = {"API", "EUR"}  # as the glossary keeps it; a currency code
# What `safestop_agent` itself records on a call (a refused approval, a call a stop cut short):
# the library's words, not the demo agents'.
AGENT_LIBRARY_WORDS = ("approval ", "interrupted by stop")
LIBRARY_NOTE = re.compile(r"\[(?:interrupted by stop|exit=)[^\]]*\]")
FIELD = re.compile(r"\{\w+\}")


def english_words(text: str) -> set[str]:
    return {word for word in WORD.findall(IDENTIFIER.sub(" ", text)) if word not in KEPT_IN_ENGLISH}


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, list):
        return [text for item in value for text in _strings(item)]
    return []


def test_every_template_the_demo_writes_is_read_by_this_test() -> None:
    written = set()
    for source in SOURCES:
        text = source.read_text(encoding="utf-8")
        written |= {
            _literal(found)
            for _quote, found in re.findall(
                r"""(?:\.t|\.echo|words\(\s*\w+,)\(?\s*(["'])((?:(?!\1)[^\\]|\\.)*)\1""", text
            )
        }
    from console.demo.accounts import DEMO_APPROVAL_RULES, DEMO_POLICIES, DEMO_TEAMS
    from console.demo.scenarios import APPROVAL_ENDINGS, LOOP_TOPICS
    from notifications.demo import DEMO_CHANNEL

    named = {
        *(name for _slug, name in DEMO_TEAMS),
        *(str(rule["name"]) for _slug, rule in DEMO_APPROVAL_RULES),
        *(str(policy["description"]) for _slug, policy in DEMO_POLICIES),
        *LOOP_TOPICS,
        *APPROVAL_ENDINGS.values(),
        DEMO_CHANNEL,
    }
    assert "building {version}" in written and "approver bot: fine" in written
    missing = sorted(template for template in written | named if template not in ZH_HANS)
    assert not missing, missing
    prose = [FIELD.sub("0", chinese) for chinese in ZH_HANS.values()]
    assert not [chinese for chinese in prose if english_words(chinese)]


def test_the_prose_detector_sees_english_and_passes_identifiers() -> None:
    assert english_words("Told the model: no") == {"Told", "the", "model"}
    assert (
        english_words("将 billing-api 2.3.1 发布到 10%：cust_1234 jane.doe@customer.example")
        == set()
    )


@pytest.mark.django_db(transaction=True)
def test_a_chinese_demo_stores_no_english_prose(stack, receiver) -> None:
    import time

    from django.core.management import call_command

    from console.demo.simulator import APPROVAL_SCENARIOS, Simulator, SimulatorConfig
    from console.demo.simulator import SCENARIOS as ALL
    from notifications.models import NotificationChannel
    from policies.models import Policy
    from runs.models import (
        Approval,
        ApprovalRule,
        Artifact,
        ExecutionRecord,
        OutboxItem,
        Run,
        SteeringMessage,
        Step,
        StopRequest,
        Team,
    )
    from tests.support.demo import team_credentials

    call_command("demo_setup", "--language", "zh-hans", stdout=io.StringIO())
    simulator = Simulator(
        SimulatorConfig(
            url=stack.url,
            teams=team_credentials(),
            receiver_url=receiver.url(""),
            concurrency=len(ALL),
            pace=0.25,
            reviewer_interval=0.8,
            bot_share=1.0,
            approval_workers=len(APPROVAL_SCENARIOS),
            approval_grace=0.5,
            approvals_left_for_humans=0,
            seed=5,
            language="zh-hans",
        )
    )
    assert simulator.wait_until_ready(10)
    simulator.start()
    try:
        simulator.run_for(12)
    finally:
        simulator.stop(timeout=15)
    time.sleep(0.5)
    ours = Run.objects.filter(pk__in=simulator.run_ids)
    seen: dict[str, list[str]] = {
        "team": list(
            Team.objects.filter(slug__in=["payments", "platform"]).values_list("name", flat=True)
        ),
        "rule": list(ApprovalRule.objects.values_list("name", flat=True)),
        "policy": list(Policy.objects.values_list("description", flat=True)),
        "channel": list(NotificationChannel.objects.values_list("name", flat=True)),
        "title": list(ours.values_list("title", flat=True)),
        "result": [t for value in ours.values_list("result", flat=True) for t in _strings(value)],
        "step": list(Step.objects.filter(run__in=ours).values_list("name", flat=True)),
        "artifact": [
            *Artifact.objects.filter(run__in=ours).values_list("name", flat=True),
            # a JSON artifact is data (its keys are code); a text one is prose
            *Artifact.objects.filter(run__in=ours, kind="text").values_list("content", flat=True),
        ],
        # what a tool printed or said; a structured result (a dict's repr) is data
        "observation": [
            text
            for text in ExecutionRecord.objects.filter(run__in=ours).values_list(
                "last_observation", flat=True
            )
            # the library's note on how a call ended ("[interrupted by stop (…)]") cut off
            for text in [LIBRARY_NOTE.sub("", text)]
            if not text.startswith(("{", "[", *AGENT_LIBRARY_WORDS))
        ],
        "payload": [
            t
            for value in OutboxItem.objects.filter(run__in=ours).values_list("payload", flat=True)
            for t in _strings(value)
        ],
        # a void approval's message is the server's ("the run was stopped …"), not the demo's
        "approval": [
            *Approval.objects.filter(run__in=ours).values_list("summary", flat=True),
            *Approval.objects.filter(run__in=ours)
            .exclude(status="void")
            .values_list("message", flat=True),
        ],
        "steering": list(
            SteeringMessage.objects.filter(run__in=ours).values_list("text", flat=True)
        ),
        # the bots' notes; the budget enforcer's and a policy's are the server's own
        "stop note": list(
            StopRequest.objects.filter(run__in=ours)
            .exclude(actor_kind="system")
            .values_list("note", flat=True)
        ),
    }
    # the teams read the demo's mail in its language
    assert set(NotificationChannel.objects.values_list("language", flat=True)) == {"zh-hans"}
    # the demo did what it does: runs, artifacts, decided approvals, bot stops
    for kind in ("title", "step", "artifact", "observation", "payload", "approval", "stop note"):
        assert any(seen[kind]), (kind, dict(simulator.outcomes))
    # A void approval's message is the server's ("the run was stopped (…)"), which an agent
    # relays to its model as it got it: cut from what the agent wrote.
    server_said = [
        text
        for text in Approval.objects.filter(run__in=ours, status="void").values_list(
            "message", flat=True
        )
        if text
    ]

    def agents_own(text: str) -> str:
        for said in server_said:
            text = text.replace(said, "")
        return text

    english = {
        kind: sorted({text for text in texts if english_words(agents_own(text))})
        for kind, texts in seen.items()
    }
    found = {kind: texts for kind, texts in english.items() if texts}
    assert not found, "\n".join(
        f"{kind}: {text!r}" for kind, texts in found.items() for text in texts
    )
