"""/api/v1/ — every row of DESIGN §5 and §10, and a JSON 404 for anything else under it."""

from __future__ import annotations

from django.urls import path, re_path
from django.views.decorators.csrf import csrf_exempt

from api import views
from api.errors import json_not_found

app_name = "api"

RUN = "runs/<str:run_id>/"

urlpatterns = [
    path("runs/", views.RunsView.as_view(), name="runs"),
    # before RUN: "stop" is not a run id
    path("runs/stop/", views.BulkStopView.as_view(), name="runs-bulk-stop"),
    path(RUN, views.RunDetailView.as_view(), name="run"),
    path(RUN + "lease/", views.LeaseAcquireView.as_view(), name="lease"),
    path(RUN + "lease/heartbeat/", views.LeaseHeartbeatView.as_view(), name="lease-heartbeat"),
    path(RUN + "lease/release/", views.LeaseReleaseView.as_view(), name="lease-release"),
    path(RUN + "permits/", views.PermitsView.as_view(), name="permits"),
    # <path:...> so a tool_call_id with an encoded "/" still reaches the view
    path(
        RUN + "tool-calls/<path:tool_call_id>/result/",
        views.ToolResultView.as_view(),
        name="tool-result",
    ),
    path(RUN + "events/", views.EventsView.as_view(), name="events"),
    path(RUN + "outbox/", views.OutboxView.as_view(), name="outbox"),
    path(RUN + "drained/", views.DrainedView.as_view(), name="drained"),
    path(RUN + "cancel/", views.CancelView.as_view(), name="cancel"),
    path(RUN + "takeover/", views.TakeoverView.as_view(), name="takeover"),
    path(RUN + "resume/", views.ResumeView.as_view(), name="resume"),
    path(RUN + "close/", views.CloseView.as_view(), name="close"),
    path(RUN + "stop-packet/", views.StopPacketView.as_view(), name="stop-packet"),
    path(
        RUN + "interruption-packet/",
        views.InterruptionPacketView.as_view(),
        name="interruption-packet",
    ),
    path(
        RUN + "stop-packets/<int:epoch>/",
        views.StopPacketEpochView.as_view(),
        name="stop-packet-epoch",
    ),
    path(RUN + "resolutions/", views.ResolutionsView.as_view(), name="resolutions"),
    path(RUN + "steering/", views.SteeringView.as_view(), name="steering"),
    path("approvals/", views.ApprovalsView.as_view(), name="approvals"),
    path("approvals/<str:approval_id>/", views.ApprovalDetailView.as_view(), name="approval"),
    path(
        "approvals/<str:approval_id>/decide/",
        views.ApprovalDecideView.as_view(),
        name="approval-decide",
    ),
    path("approval-rules/", views.ApprovalRulesView.as_view(), name="approval-rules"),
    path(
        "approval-rules/<int:rule_id>/",
        views.ApprovalRuleDetailView.as_view(),
        name="approval-rule",
    ),
    path("ledger/", views.LedgerView.as_view(), name="ledger"),
    path("metrics/stop-quality/", views.StopQualityView.as_view(), name="stop-quality"),
    path("security/denials/", views.DenialsView.as_view(), name="denials"),
    # Any path, an encoded newline included ([\s\S], not "."), and any method: a POST with a
    # session cookie but no CSRF token would otherwise get the CSRF failure's HTML 403. It
    # only ever answers 404.
    re_path(r"^[\s\S]*$", csrf_exempt(json_not_found), name="not-found"),
]
