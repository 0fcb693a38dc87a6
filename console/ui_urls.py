"""The console's pages. Every POST here also works without JavaScript (form + redirect)."""

from __future__ import annotations

from django.urls import path
from django.views.generic import RedirectView
from django.views.i18n import JavaScriptCatalog

import console.converters  # noqa: F401  (registers <run_id:...>)
from accounts.oidc import logout
from console.views import (
    approvals,
    audit,
    auth,
    budgets,
    bulk,
    decisions,
    handoffs,
    language,
    needs_me,
    notifications,
    packets,
    policies,
    quality,
    run,
    runs,
    tokens,
    upstreams,
)

app_name = "console"

urlpatterns = [
    path("login/", auth.LoginPage.as_view(), name="login"),
    path("language/", language.language_set, name="language"),
    # The console's scripts' strings (static/console/*.js call gettext()), in the reader's
    # language; the script is same-origin, as the Content-Security-Policy wants.
    path("jsi18n/", JavaScriptCatalog.as_view(domain="djangojs"), name="jsi18n"),
    # Also ends the IdP's session when the sign-in came from it (RP-initiated logout).
    path("logout/", logout, name="logout"),
    path("", runs.runs_list, name="runs"),
    path("home/", needs_me.home, name="home"),
    path("needs-me/", needs_me.needs_me, name="needs_me"),
    path("nav-counts/", needs_me.nav_counts_fragment, name="nav_counts"),
    path("runs/", RedirectView.as_view(pattern_name="console:runs", query_string=True)),
    path("runs/<run_id:run_id>/", run.run_page, name="run"),
    path("runs/<run_id:run_id>/stop/", run.run_stop, name="run_stop"),
    path("runs/<run_id:run_id>/takeover/", run.run_takeover, name="run_takeover"),
    path("runs/<run_id:run_id>/resume/", run.run_resume, name="run_resume"),
    path("runs/<run_id:run_id>/close/", run.run_close, name="run_close"),
    path("runs/<run_id:run_id>/steering/", run.steering_add, name="steering_add"),
    # A decision offered on several pages: one view, an endpoint per page, `on` its answer.
    path(
        "runs/<run_id:run_id>/steering/<int:message_id>/decide/",
        decisions.steering_decide,
        {"on": run.STEERING_OFFER},
        name="steering_decide",
    ),
    path(
        "runs/<run_id:run_id>/outbox/<int:item_id>/<str:decision>/",
        decisions.outbox_decide,
        {"on": run.OUTBOX_OFFER},
        name="outbox_decide",
    ),
    path(
        "runs/<run_id:run_id>/handoff/steering/<int:message_id>/decide/",
        decisions.steering_decide,
        {"on": handoffs.STEERING_OFFER},
        name="handoff_steering_decide",
    ),
    path(
        "runs/<run_id:run_id>/packet/outbox/<int:item_id>/<str:decision>/",
        decisions.outbox_decide,
        {"on": packets.OUTBOX_OFFER},
        name="packet_outbox_decide",
    ),
    path("runs/<run_id:run_id>/packet/", packets.packet_latest, name="packet_latest"),
    path("runs/<run_id:run_id>/packets/<int:epoch>/", packets.packet_page, name="packet"),
    path("runs/<run_id:run_id>/packets/<int:epoch>.json", packets.packet_json, name="packet_json"),
    path("runs/<run_id:run_id>/resolve/", packets.resolve, name="resolve"),
    path("approvals/", approvals.inbox, name="approvals"),
    path("approvals/rules/", approvals.rules, name="approval_rules"),
    path("approvals/rules/<int:rule_id>/", approvals.rule_edit, name="approval_rule"),
    path(
        "approvals/rules/<int:rule_id>/delete/", approvals.rule_delete, name="approval_rule_delete"
    ),
    path("approvals/<str:approval_id>/", approvals.approval_page, name="approval"),
    path("approvals/<str:approval_id>/decide/", approvals.approval_decide, name="approval_decide"),
    path("policies/", policies.policies, name="policies"),
    path("policies/<int:policy_id>/", policies.policy_edit, name="policy"),
    path("policies/<int:policy_id>/delete/", policies.policy_remove, name="policy_delete"),
    path("policies/<int:policy_id>/test/", policies.policy_history_test, name="policy_test"),
    path(
        "approvals/<str:approval_id>/decide/inline/",
        approvals.approval_decide_inline,
        name="approval_decide_inline",
    ),
    path("handoffs/", handoffs.handoffs, name="handoffs"),
    path("stops/bulk/preview/", bulk.bulk_stop_preview, name="bulk_stop_preview"),
    path("stops/bulk/", bulk.bulk_stop_confirm, name="bulk_stop_confirm"),
    path("stops/bulk/<str:bulk_id>/", bulk.bulk_stop_page, name="bulk_stop"),
    path("handoffs/<int:handoff_id>/<str:action>/", handoffs.handoff_action, name="handoff_action"),
    path("upstreams/", upstreams.upstreams, name="mcp_upstreams"),
    path("upstreams/<int:upstream_id>/", upstreams.upstream_edit, name="mcp_upstream"),
    path(
        "upstreams/<int:upstream_id>/delete/",
        upstreams.upstream_remove,
        name="mcp_upstream_delete",
    ),
    path("audit/", audit.audit, name="audit"),
    path("audit/verify/", audit.audit_verify, name="audit_verify"),
    path("audit.csv", audit.audit_csv, name="audit_csv"),
    path("quality/", quality.quality, name="quality"),
    path("tokens/", tokens.tokens, name="tokens"),
    path("budgets/", budgets.budgets, name="team_budget"),
    path("budgets/prices/", budgets.price_save, name="team_price_save"),
    path("budgets/prices/<int:price_id>/delete/", budgets.price_delete, name="team_price_delete"),
    path("tokens/<int:token_id>/revoke/", tokens.token_revoke, name="token_revoke"),
    path("notifications/", notifications.channels, name="notifications"),
    path(
        "notifications/channels/<int:channel_id>/",
        notifications.channel_edit,
        name="notification_channel",
    ),
    path(
        "notifications/channels/<int:channel_id>/test/",
        notifications.channel_test,
        name="notification_channel_test",
    ),
    path(
        "notifications/channels/<int:channel_id>/delete/",
        notifications.channel_delete,
        name="notification_channel_delete",
    ),
    path("notifications/deliveries/", notifications.deliveries, name="notification_deliveries"),
    path("notifications/outbox/", notifications.outbox, name="notification_outbox"),
    path(
        "notifications/subscriptions/",
        notifications.subscriptions,
        name="notification_subscriptions",
    ),
    path(
        "notifications/subscriptions/slack/",
        notifications.slack_link,
        name="notification_slack_link",
    ),
    path(
        "notifications/slack-links/<int:link_id>/unlink/",
        notifications.slack_unlink,
        name="notification_slack_unlink",
    ),
    path("integrations/slack/actions/", notifications.slack_actions, name="slack_actions"),
]
