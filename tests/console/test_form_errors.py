"""A form's errors in the reader's language: each after its field's translated label ("原因：…"),
never the field's code name, and every console form field has a label to show."""

from __future__ import annotations

import inspect
import re
from typing import Any

import pytest
from django import forms
from django.utils import translation

from console import forms as console_forms
from console.views import upstreams
from console.views.common import form_errors
from notifications import forms as notification_forms
from runs.models import RunStatus
from tests.support.htmx import htmx
from tests.support.scenarios import running

CJK = re.compile(r"[\u4e00-\u9fff]")
# Labels that read the same in Chinese (an acronym), and the form kwargs each form needs.
SAME_IN_CHINESE = {"URL"}
FORM_KWARGS: dict[str, dict[str, Any]] = {
    "TokenCreateForm": {"teams": [("t", "t")]},
    "ApprovalRuleForm": {"teams": [("t", "t")]},
    "PolicyForm": {"teams": [("t", "t")]},
    "ChannelForm": {"teams": [("t", "t")]},
    "SubscriptionForm": {"teams": [("t", "t")]},
    "UpstreamCreateForm": {"teams": ["t"]},
}


def _form_classes() -> list[type[forms.Form]]:
    found = []
    for module in (console_forms, notification_forms, upstreams):
        for _name, value in inspect.getmembers(module, inspect.isclass):
            if issubclass(value, forms.Form) and value.__module__ == module.__name__:
                found.append(value)
    return found


def test_the_forms_were_found() -> None:
    names = {form.__name__ for form in _form_classes()}
    assert {"StopForm", "ApprovalDecisionForm", "ChannelForm", "UpstreamCreateForm"} <= names


@pytest.mark.parametrize("form_class", _form_classes(), ids=lambda form: form.__name__)
def test_every_field_has_a_label_in_chinese(form_class: type[forms.Form]) -> None:
    form = form_class(**FORM_KWARGS.get(form_class.__name__, {}))
    with translation.override("zh-hans"):
        for name, field in form.fields.items():
            label = str(field.label or "")
            assert CJK.search(label) or label in SAME_IN_CHINESE, (form_class.__name__, name)


def test_a_field_error_follows_its_label_in_chinese() -> None:
    with translation.override("zh-hans"):
        form = console_forms.StopForm({"reason": "bogus"})
        line = form_errors(form)
    assert line.startswith("原因："), line
    assert "reason" not in line and "bogus" in line and CJK.search(line.removeprefix("原因："))


def test_a_field_error_follows_its_label_in_english() -> None:
    with translation.override("en"):
        line = form_errors(console_forms.StopForm({"reason": "bogus"}))
    assert line.startswith("Reason: Select a valid choice."), line


def test_several_errors_join_with_the_languages_separator() -> None:
    data = {"decision": "maybe", "arguments": "{not json"}
    with translation.override("zh-hans"):
        line = form_errors(console_forms.ApprovalDecisionForm(data))
    assert line.count("；") == 1 and "决定：" in line and "参数：" in line, line
    with translation.override("en"):
        line = form_errors(console_forms.ApprovalDecisionForm(data))
    assert line.count("; ") == 1 and "Decision: " in line and "Arguments: " in line, line


def test_an_error_of_the_whole_form_has_no_label_and_a_left_out_field_is_left_out() -> None:
    with translation.override("zh-hans"):
        form = console_forms.ApprovalDecisionForm(
            {"decision": "reject", "arguments": '{"amount": 1}'}
        )
        assert form_errors(form) == str(form.non_field_errors()[0])
        channel = notification_forms.ChannelForm(
            {"team": "nope", "name": "n", "kind": "email", "target": ""},
            teams=[("t", "t")],
        )
        line = form_errors(channel, leave_out=["target"])
    assert line.startswith("团队：") and "目标" not in line, line


@pytest.mark.django_db
def test_a_refused_stop_names_the_field_in_the_readers_language(as_reviewer, team) -> None:
    run, _lease = running(team)
    refused = as_reviewer.post(
        f"/runs/{run.pk}/stop/",
        {"reason": "admin_kill"},
        HTTP_ACCEPT_LANGUAGE="zh-CN",
        **htmx("run-actions"),
    )
    body = refused.content.decode()
    assert refused.status_code == 200 and "原因：" in body and "reason:" not in body
    run.refresh_from_db()
    assert run.status == RunStatus.RUNNING


# --------------------------------------------------------------------------------------------
# words the Chinese walk of the demo console found still English


def test_what_was_reported_after_a_stop_reads_in_chinese() -> None:
    from console.selectors.packets import PacketView

    snap = {
        "reported_after_stop": [{"type": "run.completed", "epoch": 2, "at": None}],
        "completed_steps": [
            {"seq": 3, "name": "起草回复", "key": "draft", "reported_after_stop": True}
        ],
        "tool_calls": [
            {
                "tool_call_id": "call_1",
                "tool": "shell",
                "execution_state": "unknown",
                "reported_after_stop": True,
            }
        ],
    }
    view = PacketView(
        packet=None, snap=snap, is_current=True, unknowns=[], frozen=[], resolutions=[]
    )
    with translation.override("zh-hans"):
        facts = [fact["what"] for fact in view.reported_after_stop]
    assert facts == [
        "run.completed（纪元 2）",
        "步骤 3「起草回复」已完成",
        "工具调用 call_1（shell）：未知",
    ]


def test_a_policy_stop_reason_has_its_words() -> None:
    from runs.labels import label_for
    from runs.models import StopReason

    with translation.override("zh-hans"):
        assert label_for(StopReason.POLICY_VIOLATION) == "违反策略"
