"""What a person reads on a page, and the English words left in it.

Visible text is every text node outside <script>, <style>, <code>, <pre>, <kbd>, <samp> and
elements marked `mono` (ids, hashes, tool and agent names, code), plus the attributes a person
or a screen reader meets (title, aria-label, placeholder, alt, a button's value). The fixture's
own data — run titles, notes, agent and tool names, observations a test wrote — is the reader's
content, not the console's words, and is taken out before looking for English.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from html.parser import HTMLParser
from typing import Any

from django.apps import apps
from django.db import models

HIDDEN_TAGS = frozenset({"script", "style", "code", "pre", "kbd", "samp", "template"})
VOID_TAGS = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
)
READ_ATTRIBUTES = ("title", "aria-label", "placeholder", "alt", "aria-description")
# Words that stay English in a Chinese console: names of products, protocols and formats,
# and the product's own name.
ALLOWED_WORDS = frozenset(
    {
        "safestop",
        "json",
        "csv",
        "api",
        "http",
        "https",
        "url",
        "urls",
        "id",
        "ids",
        "slack",
        "webhook",
        "webhooks",
        "apprise",
        "mcp",
        "schema",
        "utc",
        "tls",
        "stdio",
        "ai",
        "teams",
        "discord",
        "telegram",
        "standard",
        "github",
        "sso",
        "oidc",
        "scim",
        "md",
        "cel",
        "docs",
        "ok",
        "get",
        "post",
        "usd",
        "ms",
        "pdf",
        "html",
        "smtp",
        "idp",
    }
)
WORD = re.compile(r"[A-Za-z][A-Za-z']+")
# Tokens that are code, not prose: snake_case, dotted names, paths, addresses, globs, versions.
CODE_TOKEN = re.compile(r"\S*[_./@#*=<>:\\$`~|\[\]{}]\S*|\S*\d\S*|\S+-\S+")


class _Visible(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.stack: list[tuple[str, bool]] = []
        self.texts: list[str] = []

    def _hidden(self) -> bool:
        return any(hidden for _tag, hidden in self.stack)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = dict(attrs)
        classes = (values.get("class") or "").split()
        hidden = tag in HIDDEN_TAGS or "mono" in classes or "hidden" in values
        if not self._hidden() and not hidden:
            for name in READ_ATTRIBUTES:
                if values.get(name):
                    self.texts.append(values[name] or "")
            if (
                tag == "input"
                and values.get("type") in ("submit", "button")
                and values.get("value")
            ):
                self.texts.append(values["value"] or "")
        if tag not in VOID_TAGS:
            self.stack.append((tag, hidden))

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.handle_starttag(tag, attrs)
        if tag not in VOID_TAGS and self.stack and self.stack[-1][0] == tag:
            self.stack.pop()

    def handle_endtag(self, tag: str) -> None:
        for index in range(len(self.stack) - 1, -1, -1):
            if self.stack[index][0] == tag:
                del self.stack[index:]
                break

    def handle_data(self, data: str) -> None:
        if not self._hidden() and data.strip():
            self.texts.append(data)


def visible_texts(html: str) -> list[str]:
    parser = _Visible()
    parser.feed(html)
    parser.close()
    return parser.texts


def _strings_in(value: Any) -> Iterable[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings_in(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _strings_in(item)


# What the console itself wrote (a notification's words, a captured mail): checked, never data.
NOT_DATA = frozenset({"notifications.Delivery", "notifications.CapturedMail"})


def fixture_data_strings(
    app_labels: Iterable[str] = ("runs", "handoff", "notifications"),
) -> list[str]:
    """Every free-text value the fixture stored (titles, notes, names, JSON payloads); fields
    with choices are codes the console must translate, so they are not data."""
    found: set[str] = set()
    for label in app_labels:
        for model in apps.get_app_config(label).get_models():
            if model._meta.label in NOT_DATA:
                continue
            fields = [
                field.name
                for field in model._meta.concrete_fields
                if isinstance(field, models.CharField | models.TextField | models.JSONField)
                and not field.choices
            ]
            if not fields:
                continue
            for row in model.objects.values_list(*fields):
                for value in row:
                    if isinstance(value, str) and value.startswith(("{", "[")):
                        try:
                            value = json.loads(value)
                        except ValueError:
                            pass
                    found.update(text for text in _strings_in(value) if len(text) >= 2)
    from django.contrib.auth import get_user_model

    found.update(get_user_model().objects.values_list("username", flat=True))
    return sorted(found, key=len, reverse=True)


def english_words(texts: Iterable[str], data: Iterable[str] = ()) -> list[str]:
    """The English words of `texts`, once the data, the code tokens and the allowed words are
    taken out. Each is returned with a little context, for the failure message."""
    values = sorted(set(data), key=len, reverse=True)
    # whole values only: the fixture's "ok" must not eat into the console's "Webhook"
    pattern = (
        re.compile("|".join(rf"(?<!\w){re.escape(value)}(?!\w)" for value in values))
        if values
        else None
    )
    found = []
    for text in texts:
        if pattern is not None:
            text = pattern.sub(" ", text)
        prose = CODE_TOKEN.sub(" ", text)
        for match in WORD.finditer(prose):
            if match.group(0).lower() not in ALLOWED_WORDS:
                found.append(f"{match.group(0)!r} in {text.strip()[:80]!r}")
    return found
