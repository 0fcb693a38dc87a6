"""The zh-Hans message catalog is checked, not hoped: it holds every string the code marks
(re-extracting changes nothing but its date line), every entry is translated and none is fuzzy,
msgfmt compiles it with its format checks, and the glossary's terms are used as chosen."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import polib
import pytest

ROOT = Path(__file__).resolve().parents[2]
CATALOGS = sorted((ROOT / "locale").glob("*/LC_MESSAGES/*.po"))
DATE_LINE = re.compile(r'^"POT-Creation-Date: .*\\n"$', re.M)
# What the copy of the tree leaves out: environments, caches, built files, other languages' tools.
NOT_COPIED = shutil.ignore_patterns(
    ".venv*",
    ".git",
    "node_modules",
    "staticfiles",
    "var",
    "*.sqlite3*",
    "__pycache__",
    ".pytest_cache",
    ".mypy_cache",
    ".ruff_cache",
    ".hypothesis",
    "*.mo",
    "screenshots",
)


def _catalog_text(path: Path) -> str:
    return DATE_LINE.sub("", path.read_text(encoding="utf-8"))


def test_there_are_catalogs_for_the_server_and_the_scripts() -> None:
    names = {(path.parent.parent.name, path.name) for path in CATALOGS}
    assert names == {("zh_Hans", "django.po"), ("zh_Hans", "djangojs.po")}


def test_extracting_again_changes_nothing_but_the_date(tmp_path: Path) -> None:
    """`make messages-update` on a copy of the tree: the committed catalogs must already be what
    it writes (a string added to the code without re-extracting fails here)."""
    copy = tmp_path / "tree"
    shutil.copytree(ROOT, copy, ignore=NOT_COPIED, symlinks=True)
    subprocess.run(
        ["bash", "scripts/messages.sh", "update"],
        cwd=copy,
        env={"PATH": "/usr/bin:/bin", "PY": sys.executable, "HOME": str(tmp_path)},
        check=True,
        capture_output=True,
        timeout=300,
    )
    changed = [
        str(path.relative_to(ROOT))
        for path in CATALOGS
        if _catalog_text(path) != _catalog_text(copy / path.relative_to(ROOT))
    ]
    new = sorted(
        str(path.relative_to(copy))
        for path in (copy / "locale").glob("*/LC_MESSAGES/*.po")
        if not (ROOT / path.relative_to(copy)).exists()
    )
    assert changed == [] and new == [], (
        f"run `make messages-update` and translate: changed {changed}, new {new}"
    )


@pytest.mark.parametrize(
    "path", CATALOGS, ids=lambda path: f"{path.parent.parent.name}/{path.name}"
)
def test_every_entry_is_translated_and_none_is_fuzzy(path: Path) -> None:
    catalog = polib.pofile(str(path))
    assert len(catalog) > 0
    untranslated = [entry.msgid for entry in catalog.untranslated_entries()]
    fuzzy = [entry.msgid for entry in catalog.fuzzy_entries()]
    # a plural entry with one empty form is untranslated too
    half_plural = [
        entry.msgid
        for entry in catalog
        if entry.msgid_plural and not all(entry.msgstr_plural.values())
    ]
    assert untranslated == [] and fuzzy == [] and half_plural == []
    assert not catalog.metadata_is_fuzzy, "the header is still marked fuzzy"
    assert catalog.metadata["Language"] == "zh_Hans"
    assert catalog.metadata["Plural-Forms"].startswith("nplurals=1;")


@pytest.mark.parametrize(
    "path", CATALOGS, ids=lambda path: f"{path.parent.parent.name}/{path.name}"
)
def test_msgfmt_compiles_with_its_checks(path: Path, tmp_path: Path) -> None:
    """--check: the placeholders of every translation match its msgid's (a Chinese string that
    drops `%(n)s` or a `{{ name }}` swapped for another fails), and the header is complete."""
    result = subprocess.run(
        ["msgfmt", "--check", "--statistics", "-o", str(tmp_path / "out.mo"), str(path)],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    assert "untranslated" not in result.stderr and "fuzzy" not in result.stderr, result.stderr


def test_the_placeholders_of_template_strings_survive_translation() -> None:
    """msgfmt checks `%(name)s`; a {% blocktranslate %} placeholder is `%(name)s` in the catalog
    too, so this is the same check for python-brace `{name}` strings (JavaScript interpolate)."""
    brace = re.compile(r"\{\w+\}|%\(\w+\)s|%s")
    broken = []
    for path in CATALOGS:
        for entry in polib.pofile(str(path)):
            wanted = sorted(brace.findall(entry.msgid))
            translations = [entry.msgstr] if not entry.msgid_plural else []
            translations += list(entry.msgstr_plural.values())
            for text in translations:
                if sorted(brace.findall(text)) != wanted and not entry.msgid_plural:
                    broken.append(entry.msgid)
    assert broken == []


GLOSSARY = ROOT / "docs" / "glossary.zh-Hans.md"
# English term (as a whole word, any case) → the word its translation must contain.
CHECKED_TERMS = {
    "take over": "接管",
    "approval": "审批",
    "side effect": "副作用",
    "unconfirmed": "未确认",
    "ledger": "账本",
    "lease": "租约",
    "epoch": "纪元",
    "outbox": "发件箱",
    "handoff": "交接",
    "steering": "引导",
    "stop packet": "停止报告",
    "stopped dirty": "未干净停止",
    "stopped cleanly": "干净停止",
}


CODE = re.compile(r"%\(\w+\)s|\b[\w]+\.[\w*]+")


def test_the_glossary_names_each_checked_term() -> None:
    text = GLOSSARY.read_text(encoding="utf-8")
    missing = [word for word in CHECKED_TERMS.values() if word not in text]
    assert missing == []


def test_the_catalog_uses_the_glossary_words() -> None:
    strays = []
    for path in CATALOGS:
        for entry in polib.pofile(str(path)):
            english = CODE.sub("", entry.msgid.lower())  # placeholders and code are not words
            translations = [entry.msgstr, *entry.msgstr_plural.values()]
            for term, word in CHECKED_TERMS.items():
                if re.search(rf"\b{re.escape(term)}", english) and not all(
                    word in text for text in translations if text
                ):
                    strays.append(f"{term} → {word}: {entry.msgid!r}")
    assert strays == [], "\n".join(strays)
