"""Reading `/metrics`: the Prometheus text as {(name, labels): value}, strictly parsed."""

from __future__ import annotations

import re

URL = "/metrics"
SAMPLE = re.compile(r"^(?P<name>[a-z_]+)(?:\{(?P<labels>[^}]*)\})? (?P<value>\S+)$")


def parse(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Prometheus text → {(name, labels): value}; fails on any line that is not well formed."""
    samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
    typed: set[str] = set()
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            typed.add(line.split()[2])
            continue
        if line.startswith("#") or not line:
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        labels = frozenset(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
        assert match["name"] in typed, f"{match['name']} has no # TYPE line"
        samples[(match["name"], labels)] = float(match["value"])
    return samples


def value(samples: dict, name: str, **labels: str) -> float:
    return samples[(name, frozenset(labels.items()))]
