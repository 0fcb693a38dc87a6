"""`make bench` ends with the figures that have a target, one line each, in the shape of
docs/BENCHMARKS.md's table: what was measured now, the target, met or not, and the command."""

from __future__ import annotations

from bench.common import Row, format_targets, latency_row, rate_row


def _lines(table: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")] for line in table.splitlines()[2:]
    ]


def test_each_figure_with_a_target_is_one_line_with_its_command() -> None:
    rows = [
        latency_row(
            "stop", "stop commit → signal", [2.0, 3.0, 9.5], target_key="p99", target_ms=10
        ),
        latency_row("stop", "  of which on-commit publish", [0.5, 0.6]),
        rate_row("ingest", "single-event requests/s, 4 clients", 117.0, "req/s", minimum=250),
        Row("scale", "ingestion 1 → 2 daphne", {"value": 1.27}, "×", "≥ 1.7×", 1.27, False),
    ]
    for row in rows:
        row.command = f"bench/run_all.py --only {row.section}"
    assert _lines(format_targets(rows)) == [
        [
            "stop commit → signal",
            "p99 9.50 ms",
            "p99 ≤ 10 ms",
            "yes",
            "`bench/run_all.py --only stop`",
        ],
        [
            "single-event requests/s, 4 clients",
            "117 req/s",
            "≥ 250 req/s",
            "**no**",
            "`bench/run_all.py --only ingest`",
        ],
        ["ingestion 1 → 2 daphne", "1.27×", "≥ 1.7×", "**no**", "`bench/run_all.py --only scale`"],
    ]


def test_variants_of_one_figure_share_a_line_met_only_if_all_are() -> None:
    figure = "runs page over 100 runs"
    rows = [
        latency_row("pages", "staff", [20.0], target_key="p95", target_ms=100, figure=figure),
        latency_row("pages", "search", [140.0], target_key="p95", target_ms=100, figure=figure),
    ]
    assert _lines(format_targets(rows)) == [
        [figure, "p95 20.0–140 ms (2 variants)", "p95 ≤ 100 ms", "**no**", ""]
    ]
