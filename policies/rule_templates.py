"""The six common rules of DESIGN §14, offered when a policy is made (console and API).

Numbers in CEL are typed: a `double` (cost, seconds) is compared with `5.0`, an `int` (counts)
with `5`; the checker refuses `run.cost_usd > 5`."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from django.utils.translation import gettext_lazy as _


@dataclass(frozen=True)
class RuleTemplate:
    key: str
    name: str
    title: Any  # lazy translation
    expression: str
    action: str

    def as_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["title"] = str(self.title)
        return data


TEMPLATES = (
    RuleTemplate(
        "failure-streak",
        "failure-streak",
        _("N tool failures in a row"),
        "run.tool_failures_in_a_row >= 3",
        "stop",
    ),
    RuleTemplate(
        "loop",
        "loop",
        _("The same call N times in a row (a loop)"),
        "call.repeats >= 5",
        "stop",
    ),
    RuleTemplate(
        "destination-allow-list",
        "destination-allow-list",
        _("A destination outside an allow-list"),
        'call.side_effect == "write" && call.destination_host != "" && '
        '!(call.destination_host in ["api.example.com", "example.org"])',
        "require_approval",
    ),
    RuleTemplate(
        "spend",
        "spend",
        _("Spend over X"),
        "run.cost_usd > 5.0",
        "stop",
    ),
    RuleTemplate(
        "running-too-long",
        "running-too-long",
        _("Running longer than T"),
        "run.elapsed_seconds > 1800.0",
        "stop",
    ),
    RuleTemplate(
        "side-effect-burst",
        "side-effect-burst",
        _("More than N side effects a minute"),
        "run.side_effects_last_minute > 10",
        "require_approval",
    ),
)

BY_KEY = {template.key: template for template in TEMPLATES}
