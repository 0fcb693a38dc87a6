"""What the console says when the domain refuses an action, why an approval waits, and the
admin's names of records and fields: in the reader's language, with the codes, the API's English
detail and the stored text unchanged."""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import pytest
from django.contrib import admin
from django.test import Client
from django.urls import reverse
from django.utils import translation

from accounts.services import user_language_set
from console.refusals import REFUSALS, refusal_sentence
from runs import errors, services
from runs.actors import Actor
from runs.errors import AssignedToSomeoneElse, BulkTooLarge, InvalidInput, StaleEpoch
from runs.labels import approval_reason_text
from runs.models import Approval, Team
from tests.support import approvals, scenarios
from tests.support.i18n import english_words, visible_texts

ROOT = Path(__file__).resolve().parents[2]
CJK = re.compile(r"[\u4e00-\u9fff]")


def _error_codes() -> list[str]:
    """Every code a domain error can carry: the classes of runs/errors.py, and the codes the
    arguments checks give their refusals (runs/argument_schemas.py)."""
    classes = {
        cls.code
        for _name, cls in inspect.getmembers(errors, inspect.isclass)
        if issubclass(cls, errors.DomainError)
    }
    source = (ROOT / "runs" / "argument_schemas.py").read_text(encoding="utf-8")
    given = set(re.findall(r'(?:SchemaRefused|ArgumentsRefused)\(\s*"(\w+)"', source))
    assert given, "the arguments checks' codes were not found"
    return sorted(classes | given)


def test_every_error_code_has_a_sentence() -> None:
    assert [code for code in _error_codes() if code not in REFUSALS] == []


def test_every_refusal_sentence_reads_in_chinese() -> None:
    with translation.override("zh-hans"):
        for code, sentences in REFUSALS.items():
            for sentence in sentences:
                text = str(sentence)
                assert CJK.search(text), (code, text)
                assert english_words([re.sub(r"%\(\w+\)s", " ", text)]) == [], (code, text)


def test_a_refusal_is_filled_with_the_values_the_error_carries() -> None:
    too_many = BulkTooLarge("this would stop 7 runs", would_stop=7, limit=5)
    assigned = AssignedToSomeoneElse("assigned to dana", status="handed_off", assignee="dana")
    stale = StaleEpoch("the lease was acquired at epoch 1, not 2", status="running", stop_epoch=2)
    bare = AssignedToSomeoneElse("assigned to someone")
    with translation.override("zh-hans"):
        assert "7" in refusal_sentence(too_many) and "5" in refusal_sentence(too_many)
        assert "dana" in refusal_sentence(assigned)
        assert "纪元 2" in refusal_sentence(stale)
        assert "%(" not in refusal_sentence(bare) and CJK.search(refusal_sentence(bare))
        expression = InvalidInput("expression: bad", field="expression", line=3, column=9)
        assert "3" in refusal_sentence(expression) and "9" in refusal_sentence(expression)
    with translation.override("en"):
        # an English reader keeps the detail as the domain wrote it (the API's words too)
        assert refusal_sentence(too_many) == "this would stop 7 runs"
    assert too_many.as_dict()["error"] == "bulk_too_large"


@pytest.fixture
def reader_of_chinese(team: Team, bob: Any) -> Client:
    user_language_set(user=bob, language="zh-hans")
    client = Client(HTTP_ACCEPT_LANGUAGE="en-US")
    client.force_login(bob)
    return client


def _messages(response: Any) -> list[str]:
    return [str(message) for message in response.context["messages"]]


@pytest.mark.django_db
def test_a_refused_decision_reads_in_chinese(team: Team, bob: Any, reader_of_chinese: Client):
    approval = approvals.waiting(team)
    services.approval_decide(
        approval_id=approval.pk, decision="reject", actor=Actor.for_user(bob), message="no"
    )
    response = reader_of_chinese.post(
        approvals.url(approval, "decide/"), {"decision": "approve"}, follow=True
    )
    shown = _messages(response)
    assert len(shown) == 1 and "这个审批已经有了决定" in shown[0], shown
    assert "运行中" in shown[0]  # the run's state, as a word, not `running`
    assert english_words(shown) == [], shown


@pytest.mark.django_db
def test_a_refused_resume_reads_in_chinese(team: Team, reader_of_chinese: Client) -> None:
    run, _lease = scenarios.running(team)
    response = reader_of_chinese.post(f"/runs/{run.pk}/resume/", {"checkpoint": ""}, follow=True)
    shown = _messages(response)
    assert len(shown) == 1 and CJK.search(shown[0]), shown
    assert english_words(shown) == [], shown


@pytest.mark.django_db
def test_the_stop_message_names_its_reason_in_chinese(
    team: Team, reader_of_chinese: Client
) -> None:
    run, _lease = scenarios.running(team)
    response = reader_of_chinese.post(
        f"/runs/{run.pk}/stop/", {"reason": "dependency_failure"}, follow=True
    )
    shown = " ".join(_messages(response))
    with translation.override("zh-hans"):
        from runs.labels import label_for

        assert label_for("dependency_failure") in shown, shown
    assert "dependency_failure" not in shown and "dependency failure" not in shown
    assert english_words([shown]) == [], shown


RULE_MATCHES = [
    "rule 'payments' matched tool 'payments.*', side effect 'write'",
    "rule \"it's late\" matched agent 'night-*', transport 'email', destination '*@x.example'",
    "rule 'all' matched everything",
]


@pytest.mark.parametrize("stored", RULE_MATCHES)
def test_a_rule_match_reads_as_stored_in_english_and_rebuilt_in_chinese(stored: str) -> None:
    with translation.override("en"):
        assert approval_reason_text(stored) == stored
    with translation.override("zh-hans"):
        chinese = approval_reason_text(stored)
    assert chinese.startswith("规则 ") and "matched" not in chinese
    assert english_words([re.sub(r"'[^']*'|\"[^\"]*\"", " ", chinese)]) == [], chinese


def test_a_reason_that_does_not_read_is_shown_as_stored() -> None:
    with translation.override("zh-hans"):
        assert approval_reason_text("held by an older wording") == "held by an older wording"
        assert CJK.search(approval_reason_text("asked by the agent"))


@pytest.mark.django_db
def test_the_approval_page_says_why_it_waits_in_chinese(
    team: Team, reader_of_chinese: Client
) -> None:
    approvals.rule(team, "payments", tool_glob="payments.*", side_effect="write")
    approval = approvals.waiting(team)
    assert approval.match_reason.startswith("rule 'payments' matched")  # stored as it was
    texts = " ".join(visible_texts(reader_of_chinese.get(approvals.url(approval)).content.decode()))
    assert "规则 'payments' 匹配了：工具 'payments.*'" in texts, texts
    assert "matched" not in texts
    assert Approval.objects.get(pk=approval.pk).match_reason == approval.match_reason


def test_every_admin_model_and_field_has_a_chinese_name() -> None:
    untranslated = []
    with translation.override("zh-hans"):
        for model in admin.site._registry:
            meta = model._meta
            if meta.app_label in ("auth", "sessions", "contenttypes", "axes", "django_celery_beat"):
                continue
            for name in (meta.verbose_name, meta.verbose_name_plural):
                if not CJK.search(str(name)):
                    untranslated.append(f"{meta.label}: {name}")
            for field in meta.get_fields():
                if (
                    field.concrete
                    and not field.auto_created
                    and not CJK.search(str(field.verbose_name))
                    and str(field.verbose_name) not in ("ID", "URI", "URL", "HTML")
                ):
                    untranslated.append(f"{meta.label}.{field.name}: {field.verbose_name}")
    assert untranslated == []


@pytest.mark.django_db
def test_the_admin_changelist_title_reads_in_chinese(admin_user: Any) -> None:
    client = Client(HTTP_ACCEPT_LANGUAGE="zh-CN")
    client.force_login(admin_user)
    html = client.get(reverse("admin:runs_run_changelist")).content.decode()
    assert "<title>选择运行查看" in html, html[:400]  # the run admin is read-only
    index = client.get(reverse("admin:index")).content.decode()
    assert "审计账本条目" in index and "审批规则" in index


def _made_notes(team: Team) -> list[str]:
    """The notes the server really writes when it stops a run itself: a policy's and a run
    budget's (the permit's budget check)."""
    from runs.models import StopRequest
    from tests.support.policies import permit, policy

    policy(team, "loop", 'call.repeats >= 2 && call.tool == "search"')
    looping, _lease = scenarios.make_running(team)
    permit(looping, "c1")
    with pytest.raises(errors.RunNotRunning):
        permit(looping, "c2")
    capped, _lease = scenarios.make_running(team, max_tool_calls=1)
    services.permit_request(
        run_id=capped.pk, epoch=1, tool_call_id="b1", tool="lookup", actor=scenarios.AGENT
    )
    with pytest.raises(errors.RunNotRunning):
        services.permit_request(
            run_id=capped.pk, epoch=1, tool_call_id="b2", tool="lookup", actor=scenarios.AGENT
        )
    return [StopRequest.objects.get(run=run).note for run in (looping, capped)]


@pytest.mark.django_db
def test_the_servers_own_stop_notes_read_in_chinese_and_stay_stored_in_english(
    team: Team,
) -> None:
    from runs.labels import system_note_text

    notes = _made_notes(team)
    assert notes[0].startswith("policy loop matched: ") and " — saw " in notes[0], notes[0]
    assert notes[1] == "budget enforced at permit", notes[1]
    for note in notes:
        with translation.override("en"):
            assert system_note_text(note) == note
        with translation.override("zh-hans"):
            shown = system_note_text(note)
            assert CJK.search(shown), shown
            assert "matched" not in shown and "enforced" not in shown, shown
    with translation.override("zh-hans"):
        # the values the policy saw and its expression are kept as they were
        assert 'call.repeats >= 2 && call.tool == "search"' in system_note_text(notes[0])
        budget = system_note_text("budget max_tool_calls exhausted: 3 tool calls of 3")
        assert budget == "预算 max_tool_calls 已耗尽：已用 3 次工具调用，上限 3", budget
        assert system_note_text("the run was stopped (user_stop)").startswith("运行已被停止（")
        assert system_note_text("please stop, wrong customer") == "please stop, wrong customer"


@pytest.mark.django_db
def test_the_run_page_shows_a_policy_stop_note_in_chinese(
    team: Team, reader_of_chinese: Client
) -> None:
    _made_notes(team)
    from runs.models import StopRequest

    stop = StopRequest.objects.filter(run__team=team, reason="policy_violation").get()
    body = reader_of_chinese.get(f"/runs/{stop.run_id}/").content.decode()
    shown = re.search(r'data-testid="run-policy-stop">(.*?)</div>', body, re.S)
    assert shown is not None
    assert "策略 loop 命中" in shown.group(1)
    assert "policy loop matched" not in shown.group(1)  # the raw ledger payload keeps it


def test_the_servers_own_actors_read_in_chinese_and_a_person_as_stored(
    team: Team, alice: Any, bob: Any, reader_of_chinese: Client
) -> None:
    by_budget = scenarios.stopped_cleanly(team, by=Actor.system("budget"), title="Over budget")
    by_policy = scenarios.stopped_cleanly(
        team, by=Actor.system("policy:loop-guard"), title="Looping"
    )
    # A person whose username is spelled like a server actor: the ledger, with the kind,
    # shows the name as stored.
    namesake = Actor(kind="user", id=str(bob.pk), name="budget")
    by_person = scenarios.stopped_cleanly(team, by=namesake, title="Stopped by a person")

    page = lambda run: " ".join(  # noqa: E731
        visible_texts(reader_of_chinese.get(reverse("console:run", args=[run.pk])).content.decode())
    )
    assert "用户停止 · 预算" in page(by_budget)
    assert "用户停止 · 策略 loop-guard" in page(by_policy)
    assert "policy:loop-guard" not in page(by_policy)
    assert "用户停止 · budget" in page(by_person)
    user_language_set(user=alice, language="zh-hans")
    admin = Client()
    admin.force_login(alice)
    audit = " ".join(visible_texts(admin.get(reverse("console:audit")).content.decode()))
    assert "策略 loop-guard" in audit and "policy:loop-guard" not in audit
    assert by_person.stop_requested_by == "budget"  # stored as it was, the person's name
    with translation.override("zh-hans"):
        from runs.labels import actor_text

        assert actor_text("budget", "user") == "budget"
        assert actor_text("budget", "system") == "预算"
        assert actor_text("alice") == "alice"
