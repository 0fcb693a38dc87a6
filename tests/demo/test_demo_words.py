"""The demo's agents write in the demo's language: every title, step name and summary the
scenarios write has its Simplified Chinese template, with the same fields."""

from __future__ import annotations

import re
import string
from pathlib import Path

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
