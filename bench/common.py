"""Shared mechanics for the benchmarks: statistics, the dedicated database, the processes.

Nothing here imports Django at module level: `bench/agent_worker.py` and
`bench/ws_viewers.py` run in their own processes without it.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable


# --------------------------------------------------------------------------------------------
# statistics


def percentile(samples: Sequence[float], fraction: float) -> float | None:
    """Nearest-rank percentile (the same definition as `runs.selectors.percentile`)."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))
    return ordered[rank]


def summary(samples: Sequence[float]) -> dict[str, Any]:
    return {
        "count": len(samples),
        "p50": percentile(samples, 0.50),
        "p95": percentile(samples, 0.95),
        "p99": percentile(samples, 0.99),
        "max": max(samples) if samples else None,
        "mean": (sum(samples) / len(samples)) if samples else None,
    }


@dataclass
class Row:
    """One line of the result table."""

    section: str
    metric: str
    figures: dict[str, Any]
    unit: str
    target: str = ""
    # the figure the target is judged on, and whether it is met (None: no target)
    judged: float | None = None
    met: bool | None = None
    note: str = ""
    # The line of the targets table this row counts in (default: its metric). Variants of one
    # figure (the runs page as staff, as a reviewer, filtered, ...) share one line.
    figure: str = ""
    # What makes this figure (set by bench/run_all.py for its sections).
    command: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "section": self.section,
            "metric": self.metric,
            "figures": self.figures,
            "unit": self.unit,
            "target": self.target,
            "judged": self.judged,
            "met": self.met,
            "note": self.note,
            "figure": self.figure,
            "command": self.command,
        }


def latency_row(
    section: str,
    metric: str,
    samples_ms: Sequence[float],
    *,
    target_key: str | None = None,
    target_ms: float | None = None,
    note: str = "",
    figure: str = "",
) -> Row:
    figures = summary(samples_ms)
    judged = figures.get(target_key) if target_key else None
    met = None if judged is None or target_ms is None else judged <= target_ms
    target = f"{target_key} ≤ {target_ms:g} ms" if target_key and target_ms is not None else ""
    return Row(section, metric, figures, "ms", target, judged, met, note, figure=figure)


def rate_row(
    section: str,
    metric: str,
    rate: float,
    unit: str,
    *,
    minimum: float | None = None,
    extra: dict[str, Any] | None = None,
    note: str = "",
) -> Row:
    met = None if minimum is None else rate >= minimum
    return Row(
        section,
        metric,
        {"rate": rate, **(extra or {})},
        unit,
        f"≥ {minimum:g} {unit}" if minimum is not None else "",
        rate,
        met,
        note,
    )


def _fmt(value: Any) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def format_table(rows: Iterable[Row]) -> str:
    """A Markdown table (it reads fine in a terminal too)."""
    lines = [
        "| section | metric | n | p50 | p95 | p99 | max | rate / value | target | met |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|:---:|",
    ]
    for row in rows:
        f = row.figures
        value = f.get("rate", f.get("value"))
        rate = f"{_fmt(value)} {row.unit}" if value is not None else ""
        met = {True: "yes", False: "**NO**", None: ""}[row.met]
        lines.append(
            f"| {row.section} | {row.metric} | {_fmt(f.get('count'))} | {_fmt(f.get('p50'))} | {_fmt(f.get('p95'))} "
            f"| {_fmt(f.get('p99'))} | {_fmt(f.get('max'))} | {rate} | {row.target} | {met} |"
        )
    return "\n".join(lines)


def _judged_text(rows: list[Row]) -> str:
    """The judged figure of one line: `p99 7.39 ms`, `47.5 %`, or a range over its variants."""
    first = rows[0]
    key = first.target.split()[0] if first.target[:1] == "p" else ""
    values = [row.judged for row in rows if row.judged is not None]
    if not values:
        return "—"
    low, high = min(values), max(values)
    shown = _fmt(low) if low == high else f"{_fmt(low)}–{_fmt(high)}"
    unit = {"": "", "×": "×"}.get(first.unit, f" {first.unit}")
    variants = f" ({len(rows)} variants)" if len(rows) > 1 else ""
    return f"{key} {shown}{unit}{variants}".strip()


def format_targets(rows: Iterable[Row]) -> str:
    """Every figure that has a target, one line each, in docs/BENCHMARKS.md's shape: the
    figure, what it measured now, the target, met or not, and the command that makes it."""
    lines: dict[tuple[str, str], list[Row]] = {}
    for row in rows:
        if row.target and row.met is not None:
            lines.setdefault((row.section, row.figure or row.metric.strip()), []).append(row)
    table = [
        "| figure | now | target | met | command |",
        "|---|---|---|:---:|---|",
    ]
    for (_section, figure), group in lines.items():
        met = "yes" if all(row.met for row in group) else "**no**"
        command = group[0].command
        table.append(
            f"| {figure} | {_judged_text(group)} | {group[0].target} | {met} | "
            f"{f'`{command}`' if command else ''} |"
        )
    return "\n".join(table)


# --------------------------------------------------------------------------------------------
# the dedicated database and Redis


def with_database(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))


def with_redis_db(url: str, db: int) -> str:
    parts = urlsplit(url)
    return urlunsplit((parts.scheme, parts.netloc, f"/{db}", parts.query, parts.fragment))


def recreate_database(admin_url: str, name: str) -> None:
    """DROP … WITH (FORCE) then CREATE: every `make bench` starts from an empty database."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_database(admin_url: str, name: str) -> None:
    import psycopg
    from psycopg import sql

    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


# --------------------------------------------------------------------------------------------
# processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_for_port(
    port: int, *, timeout: float = 30.0, process: subprocess.Popen[Any] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(
                f"process {process.args!r} exited with {process.returncode} before listening"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f}s")


@dataclass
class Managed:
    """A child process we started; stopped by its own pid (and its process group), nothing else."""

    name: str
    process: subprocess.Popen[Any]
    log_path: Path
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.process.pid

    def stop(self, timeout: float = 10.0) -> None:
        if self.process.poll() is not None:
            return
        try:
            os.killpg(self.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(5)


def start(name: str, argv: list[str], env: dict[str, str], log_dir: Path) -> Managed:
    log_path = log_dir / f"{name}.log"
    log = open(log_path, "wb")  # noqa: SIM115  (the child owns it until it exits)
    process = subprocess.Popen(
        argv, cwd=str(ROOT), env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    return Managed(name, process, log_path)


def rss_kib(pid: int) -> dict[str, int]:
    """VmRSS (now) and VmHWM (peak since the process started), in KiB, from /proc."""
    figures: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                figures[key] = int(rest.split()[0])
    return figures


def emit(message: dict[str, Any]) -> None:
    """A JSON line on stdout: how helper processes report to the orchestrator."""
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def machine() -> dict[str, str]:
    cpu = ""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass

    def run(argv: list[str]) -> str:
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "nproc": run(["nproc"]),
        "cpu": cpu,
        "memory": run(["free", "-h"]),
        "kernel": run(["uname", "-sr"]),
        "python": sys.version.split()[0],
        "postgres": run(["psql", "--version"]),
        "redis": run(["redis-server", "--version"]).split(" sha=")[0],
    }
