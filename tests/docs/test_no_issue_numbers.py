"""Code, tests and docs say why, never which tracker entry asked: a reader of the repository has
no issue tracker, so a comment that cites one explains nothing (history lives in git)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIPPED_DIRS = {
    ".git",
    ".venv",
    ".venv-matrix",
    "node_modules",
    "dist",
    "staticfiles",
    "results",
    "__pycache__",
}
TEXT_SUFFIXES = {".py", ".md", ".ts", ".js", ".html", ".toml", ".yml", ".yaml", ".cfg", ".txt"}
TEXT_NAMES = {"Makefile", "Dockerfile"}
CITATION = re.compile(r"\bissues? #?\d+|\bpoints? \d+ of issue", re.IGNORECASE)


def _text_files() -> list[Path]:
    found = []
    for path in ROOT.rglob("*"):
        parts = set(path.relative_to(ROOT).parts)
        # Every virtualenv (.venv, and the small ones of `make adapter-matrix` and
        # `make mcp-clients`) holds other people's code.
        if parts & SKIPPED_DIRS or any(
            part.endswith(".egg-info") or part.startswith(".venv") for part in parts
        ):
            continue
        if path.is_file() and (path.suffix in TEXT_SUFFIXES or path.name in TEXT_NAMES):
            found.append(path)
    return found


def test_nothing_in_the_repository_cites_an_issue_number() -> None:
    files = _text_files()
    assert len(files) > 200, "the walk found too few files: has the layout changed?"
    citing = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in files
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), start=1)
        if CITATION.search(line)
    ]
    assert citing == [], "say the reason instead:\n" + "\n".join(citing)
