"""Production defaults: settings are read from the environment at
start, so each case starts a fresh interpreter with its own environment."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]
GOOD_KEY = "k" * 20 + "Zq8-vX_3pLm0sTn2" + "r" * 20  # 56 characters, not a public one
PRODUCTION = {
    "SAFESTOP_ENV": "production",
    "SAFESTOP_SECRET_KEY": GOOD_KEY,
    "SAFESTOP_HTTPS": "1",
    "SAFESTOP_ALLOWED_HOSTS": "safestop.example.com",
    "SAFESTOP_CSRF_TRUSTED_ORIGINS": "https://safestop.example.com",
    "SAFESTOP_LEDGER_KEY": "prod1:" + "L" * 12 + "w9-Ye2" + "x" * 16,
}


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    clean = {
        key: value
        for key, value in os.environ.items()
        # DJANGO_ALLOW_ASYNC_UNSAFE: the browser tests set it in this process (tests only);
        # check --deploy rightly refuses it, and no deployment sets it.
        if not key.startswith("SAFESTOP_")
        and key not in ("DATABASE_URL", "REDIS_URL", "DJANGO_ALLOW_ASYNC_UNSAFE")
    }
    clean["SAFESTOP_SQLITE_PATH"] = str(Path(os.environ.get("TMPDIR", "/tmp")) / "ss-check.db")
    clean.update(env)
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=clean, capture_output=True, text=True, timeout=120
    )


def _settings(**env: str) -> subprocess.CompletedProcess[str]:
    return _run(
        [
            "-c",
            "import django, json; django.setup(); from django.conf import settings as s; "
            "print(json.dumps(s.DATABASES['default'], default=str))",
        ],
        DJANGO_SETTINGS_MODULE="console.settings",
        **env,
    )


@pytest.mark.parametrize(
    "key", [None, "", "change-me-in-production", "dev-only-insecure-key-change-me-in-production"]
)
def test_production_refuses_to_start_without_a_real_secret_key(key: str | None) -> None:
    env = {"SAFESTOP_ENV": "production"}
    if key is not None:
        env["SAFESTOP_SECRET_KEY"] = key
    result = _settings(**env)
    assert result.returncode != 0
    assert "SAFESTOP_SECRET_KEY" in result.stderr and "secrets.token_urlsafe" in result.stderr
    assert "Traceback" not in result.stderr


def test_development_still_starts_with_the_dev_key() -> None:
    assert _settings().returncode == 0


def test_check_deploy_is_clean_in_the_documented_production_configuration() -> None:
    result = _run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **PRODUCTION)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_warns_about_the_public_ledger_key_and_reads_a_key_file(tmp_path) -> None:
    without = {k: v for k, v in PRODUCTION.items() if k != "SAFESTOP_LEDGER_KEY"}
    result = _run(["manage.py", "check", "--deploy", "--fail-level", "WARNING"], **without)
    assert result.returncode != 0
    assert "safestop.W001" in result.stderr + result.stdout
    assert "public development ledger key" in result.stderr  # said at start, too
    key_file = tmp_path / "ledger.key"
    key_file.write_text(PRODUCTION["SAFESTOP_LEDGER_KEY"] + "\n")
    result = _run(
        ["manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        **without,
        SAFESTOP_LEDGER_KEY_FILE=str(key_file),
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_https_sets_secure_cookies_hsts_and_the_redirect() -> None:
    result = _run(
        [
            "-c",
            "import django; django.setup(); from django.conf import settings as s; "
            "print(s.SESSION_COOKIE_SECURE, s.CSRF_COOKIE_SECURE, s.SECURE_SSL_REDIRECT, "
            "s.SECURE_HSTS_SECONDS > 0)",
        ],
        DJANGO_SETTINGS_MODULE="console.settings",
        **PRODUCTION,
    )
    assert result.stdout.split() == ["True", "True", "True", "True"], result.stderr


@pytest.mark.parametrize(
    "url", ["sqlite:////tmp/ss-url.sqlite3", "sqlite:///ss-url-relative.sqlite3"]
)
def test_a_sqlite_database_url_is_the_embedded_default(url: str) -> None:
    result = _settings(DATABASE_URL=url)
    assert result.returncode == 0, result.stderr
    config = result.stdout
    assert '"transaction_mode": "IMMEDIATE"' in config and "journal_mode=WAL" in config
    assert "pool" not in config
    check = _run(["manage.py", "check"], DATABASE_URL=url)
    assert check.returncode == 0, check.stderr


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://u:p@db/safestop", "'mysql' is not supported"),
        ("nonsense", "'(none)' is not supported"),
        ("sqlite://", "names no file"),
    ],
)
def test_an_unsupported_database_url_is_a_message_not_a_traceback(url: str, says: str) -> None:
    result = _settings(DATABASE_URL=url)
    assert result.returncode != 0
    assert says in result.stderr and "SAFESTOP_SQLITE_PATH" in result.stderr
    assert "Traceback" not in result.stderr


# --------------------------------------------------------------------------------------------
# Content-Security-Policy: the console runs no inline script


@pytest.mark.django_db
def test_console_pages_carry_a_csp_without_inline_script(bob: object) -> None:
    client = Client()
    client.force_login(bob)  # type: ignore[arg-type]
    for path in ("/login/", "/"):
        policy = client.get(path)["Content-Security-Policy"]
        directives = dict(part.strip().split(" ", 1) for part in policy.split(";") if part.strip())
        assert directives["script-src"] == "'self'"
        assert "unsafe" not in policy
        assert directives["frame-ancestors"] == "'none'"


INLINE_SCRIPT = re.compile(r"<script(?![^>]*\bsrc=)[^>]*>", re.IGNORECASE)
INLINE_HANDLER = re.compile(r"<[^>]+\son[a-z]+\s*=", re.IGNORECASE)


def test_no_template_has_an_inline_script_or_event_handler() -> None:
    offenders = []
    for template in sorted((ROOT / "templates").rglob("*.html")):
        text = template.read_text()
        for pattern in (INLINE_SCRIPT, INLINE_HANDLER, re.compile(r"javascript:", re.I)):
            offenders += [
                f"{template.relative_to(ROOT)}: {m.group(0)[:80]}" for m in pattern.finditer(text)
            ]
    assert not offenders, "the Content-Security-Policy would block:\n" + "\n".join(offenders)


@pytest.mark.django_db
def test_the_api_docs_page_runs_no_inline_script() -> None:
    body = Client().get("/api/docs/").content.decode()
    assert not INLINE_SCRIPT.findall(body)
    assert Client().get("/api/docs/?script").status_code == 200


INLINE_STYLE = re.compile(r"""<[^>]+\sstyle\s*=\s*["']""", re.IGNORECASE)


def test_no_console_markup_has_an_inline_style() -> None:
    """style-src 'self' refuses style attributes too (the quality page's meters were one).
    Emails are exempt: they are read in mail clients, not under the console's policy."""
    sources = [
        *sorted((ROOT / "templates").rglob("*.html")),
        *sorted((ROOT / "console" / "templatetags").glob("*.py")),
    ]
    offenders = [
        f"{path.relative_to(ROOT)}: {match.group(0)[:80]}"
        for path in sources
        if "notifications/email" not in str(path)
        for match in INLINE_STYLE.finditer(path.read_text())
    ]
    assert not offenders, "the Content-Security-Policy would block:\n" + "\n".join(offenders)
