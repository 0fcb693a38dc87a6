"""Django admin for every record of the runs app.

Teams and memberships are configuration and are edited here. Everything else is the state of
runs, and state changes only through `runs.services` (one place for every write, each ledgered),
so those records are view-only here; the few admin actions call the services. The ledger is
append-only in the database (a trigger) and has no add, change or delete permission here.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from runs import services
from runs.actors import Actor
from runs.errors import DomainError
from runs.models import (
    ApiToken,
    Approval,
    ApprovalRisk,
    ApprovalRule,
    Artifact,
    BulkStop,
    BulkStopPreview,
    BulkStopResult,
    Checkpoint,
    EventReceipt,
    ExecutionRecord,
    Lease,
    LedgerEntry,
    LedgerVerification,
    Membership,
    OutboxItem,
    RejectedWrite,
    Run,
    SteeringMessage,
    Step,
    StopReason,
    StopRequest,
    Team,
    TeamBudget,
    TeamPrice,
    Usage,
)
from runs.tokens import api_token_revoke


class ReadOnlyAdmin(admin.ModelAdmin):
    """View-only: these rows change through the services, never by hand."""

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 1
    autocomplete_fields = ["user"]


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["slug", "name", "created_at"]
    search_fields = ["slug", "name"]
    inlines = [MembershipInline]


@admin.register(Membership)
class MembershipAdmin(admin.ModelAdmin):
    list_display = ["user", "team", "role"]
    list_filter = ["role", "team"]
    search_fields = ["user__username", "team__slug"]
    autocomplete_fields = ["user", "team"]


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens are made by `create_api_token` or the console's Tokens page (the raw value is shown once)."""

    list_display = ["name", "team", "role", "prefix", "created_at", "last_used_at", "revoked_at"]
    list_filter = ["role", "team", "revoked_at"]
    search_fields = ["name", "prefix", "team__slug"]
    exclude = ["token_hash"]
    actions = ["revoke"]

    @admin.action(description="Revoke the selected tokens")
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        for token in queryset.filter(revoked_at__isnull=True):
            api_token_revoke(token_id=token.pk, actor=Actor.for_user(request.user))
        self.message_user(request, "Revoked.")

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [field.name for field in ApiToken._meta.fields if field.name != "token_hash"]


class StepInline(admin.TabularInline):
    model = Step
    fields = ("seq", "key", "name", "kind", "status", "epoch", "started_at", "finished_at")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = True

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(Run)
class RunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "title",
        "agent",
        "team",
        "status",
        "stop_epoch",
        "stop_reason",
        "created_at",
    ]
    list_filter = ["status", "stop_reason", "team", "agent"]
    search_fields = ["id", "title", "agent"]
    date_hierarchy = "created_at"
    list_select_related = ["team"]
    inlines = [StepInline]
    actions = ["admin_kill"]

    @admin.action(description="Stop the selected runs (admin kill)")
    def admin_kill(self, request: HttpRequest, queryset: QuerySet[Run]) -> None:
        """The same stop path as the console's Stop button, with reason admin_kill."""
        stopped = 0
        for run_id in queryset.values_list("pk", flat=True):
            try:
                outcome = services.run_stop(
                    run_id=run_id,
                    reason=StopReason.ADMIN_KILL,
                    actor=Actor.for_user(request.user),
                    note="admin action",
                )
            except DomainError as error:
                self.message_user(request, f"{run_id}: {error.detail}", level=messages.WARNING)
                continue
            stopped += outcome.created
        self.message_user(request, f"Stop recorded for {stopped} run(s).")


@admin.register(Step)
class StepAdmin(ReadOnlyAdmin):
    list_display = ["run", "seq", "key", "kind", "status", "epoch", "started_at", "finished_at"]
    list_filter = ["status", "kind"]
    search_fields = ["run__id", "key", "name"]
    list_select_related = ["run"]


@admin.register(ExecutionRecord)
class ExecutionRecordAdmin(ReadOnlyAdmin):
    list_display = [
        "tool_call_id",
        "run",
        "tool",
        "side_effect",
        "execution_state",
        "side_effect_state",
        "remote_cancel_state",
        "permit_epoch",
        "resolved",
        "permitted_at",
    ]
    list_filter = [
        "execution_state",
        "side_effect_state",
        "remote_cancel_state",
        "side_effect",
        "resolved",
    ]
    search_fields = ["tool_call_id", "operation_id", "idempotency_key", "run__id", "tool"]
    list_select_related = ["run"]


@admin.register(OutboxItem)
class OutboxItemAdmin(ReadOnlyAdmin):
    list_display = [
        "public_id",
        "run",
        "transport",
        "destination",
        "status",
        "enqueue_epoch",
        "claim_epoch",
        "attempts",
        "created_at",
    ]
    list_filter = ["status", "transport"]
    search_fields = ["run__id", "idempotency_key", "destination"]
    list_select_related = ["run"]


@admin.register(Lease)
class LeaseAdmin(ReadOnlyAdmin):
    list_display = [
        "run",
        "worker_id",
        "epoch",
        "acquired_at",
        "heartbeat_at",
        "expires_at",
        "released_at",
        "release_reason",
        "fenced_unconfirmed",
    ]
    list_filter = ["release_reason", "fenced_unconfirmed"]
    search_fields = ["run__id", "worker_id"]
    exclude = ["token"]
    list_select_related = ["run"]


@admin.register(StopRequest)
class StopRequestAdmin(ReadOnlyAdmin):
    list_display = [
        "run",
        "reason",
        "requested_by",
        "requested_at",
        "epoch_before",
        "epoch_after",
        "outcome_state",
        "takeover",
    ]
    list_filter = ["reason", "outcome_state", "takeover", "actor_kind"]
    search_fields = ["run__id", "requested_by", "note"]
    date_hierarchy = "requested_at"
    list_select_related = ["run"]


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["name", "run", "kind", "reusable", "evidence", "epoch", "created_at"]
    list_filter = ["reusable", "evidence", "kind"]
    search_fields = ["name", "run__id", "uri"]
    list_select_related = ["run"]


@admin.register(Checkpoint)
class CheckpointAdmin(ReadOnlyAdmin):
    list_display = ["label", "run", "step_seq", "epoch", "created_at"]
    search_fields = ["label", "run__id"]
    list_select_related = ["run"]


@admin.register(Usage)
class UsageAdmin(ReadOnlyAdmin):
    list_display = [
        "run",
        "model",
        "provider",
        "input_tokens",
        "output_tokens",
        "cost_usd",
        "price_source",
        "price_version",
        "at",
    ]
    list_filter = ["price_source", "provider"]
    search_fields = ["run__id", "model", "event_id"]
    list_select_related = ["run"]


# Read-only: a team's budgets and prices change through the console's Budgets page or the API,
# whose services ledger every change.
@admin.register(TeamBudget)
class TeamBudgetAdmin(ReadOnlyAdmin):
    list_display = [
        "team",
        "time_zone",
        "daily_usd",
        "monthly_usd",
        "day",
        "day_spent_usd",
        "month",
        "month_spent_usd",
        "updated_by",
    ]
    list_select_related = ["team"]


@admin.register(TeamPrice)
class TeamPriceAdmin(ReadOnlyAdmin):
    list_display = [
        "team",
        "model",
        "provider",
        "input_usd_per_mtok",
        "output_usd_per_mtok",
        "version",
        "updated_by",
    ]
    search_fields = ["model"]
    list_select_related = ["team"]


@admin.register(SteeringMessage)
class SteeringMessageAdmin(ReadOnlyAdmin):
    list_display = ["run", "author", "status", "created_at", "applied_at"]
    list_filter = ["status"]
    search_fields = ["run__id", "author", "text"]
    list_select_related = ["run"]


@admin.register(EventReceipt)
class EventReceiptAdmin(ReadOnlyAdmin):
    list_display = ["run", "event_id", "type", "epoch", "outcome", "code", "received_at"]
    list_filter = ["outcome", "type", "code"]
    search_fields = ["run__id", "event_id"]
    list_select_related = ["run"]


@admin.register(RejectedWrite)
class RejectedWriteAdmin(ReadOnlyAdmin):
    list_display = ["run", "kind", "epoch", "run_epoch", "code", "at"]
    list_filter = ["kind", "code"]
    search_fields = ["run__id"]
    list_select_related = ["run"]


@admin.register(LedgerVerification)
class LedgerVerificationAdmin(ReadOnlyAdmin):
    """Records of walks of the ledger (the audit page asks for new ones)."""

    list_display = [
        "id",
        "requested_by",
        "requested_at",
        "started_at",
        "finished_at",
        "checked",
        "broken_entry_id",
        "error",
    ]
    list_filter = ["requested_by"]
    date_hierarchy = "requested_at"


@admin.register(LedgerEntry)
class LedgerEntryAdmin(ReadOnlyAdmin):
    """Append-only and hash-chained: no add, change or delete, even for superusers."""

    list_display = [
        "id",
        "at",
        "team_slug",
        "run",
        "run_seq",
        "actor_kind",
        "actor",
        "action",
        "reason",
    ]
    list_filter = ["actor_kind", "action", "team_slug"]
    search_fields = ["run__id", "actor", "action", "reason", "hash"]
    date_hierarchy = "at"
    ordering = ["-id"]
    actions = None

    def get_actions(self, request: HttpRequest) -> dict[str, Any]:
        return {}


class ApprovalRuleAdminForm(forms.ModelForm):
    """The console's rule checks (`runs.services.approval_rule_validate`), as form errors."""

    side_effect = forms.ChoiceField(
        required=False, choices=[("", "Any call"), ("write", "Writes only")]
    )
    transport = forms.ChoiceField(
        required=False, choices=[("", "Any transport"), *((t, t) for t in services.TRANSPORTS)]
    )
    risk = forms.ChoiceField(choices=ApprovalRisk.choices, initial=ApprovalRisk.MEDIUM)

    class Meta:
        model = ApprovalRule
        fields = ["team", *services.APPROVAL_RULE_FIELDS]

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        fields = {name: data[name] for name in services.APPROVAL_RULE_FIELDS if name in data}
        try:
            services.approval_rule_validate(**fields)
        except DomainError as error:
            field = error.extra.get("field")
            self.add_error(field if field in self.fields else None, error.detail)
        return data


@admin.register(ApprovalRule)
class ApprovalRuleAdmin(admin.ModelAdmin):
    """Team configuration, edited here by staff and on the console's rules page by team admins;
    either way through the rule services, so every change is ledgered."""

    form = ApprovalRuleAdminForm
    list_display = [
        "name",
        "team",
        "position",
        "enabled",
        "applies_to",
        "tool_glob",
        "side_effect",
        "agent_glob",
        "transport",
        "destination_glob",
        "risk",
        "timeout_seconds",
        "escalate_after_seconds",
    ]
    list_filter = ["team", "enabled", "applies_to", "risk"]
    search_fields = ["name", "tool_glob", "agent_glob", "destination_glob", "team__slug"]
    list_select_related = ["team"]
    ordering = ["team__slug", "position", "id"]

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        # A rule stays with its team (its approvals and ledger entries name it).
        return ["team", "created_by", "created_at"] if obj is not None else []

    def save_model(self, request: HttpRequest, obj: ApprovalRule, form: Any, change: bool) -> None:
        fields = {
            name: form.cleaned_data[name]
            for name in services.APPROVAL_RULE_FIELDS
            if name in form.cleaned_data
        }
        actor = Actor.for_user(request.user)
        if change:
            saved = services.approval_rule_update(rule_id=obj.pk, actor=actor, **fields)
        else:
            saved = services.approval_rule_create(team_id=obj.team_id, actor=actor, **fields)
        obj.pk = saved.pk
        obj.created_by = saved.created_by

    def delete_model(self, request: HttpRequest, obj: ApprovalRule) -> None:
        services.approval_rule_delete(rule_id=obj.pk, actor=Actor.for_user(request.user))

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[ApprovalRule]) -> None:
        for rule_id in queryset.values_list("pk", flat=True):
            services.approval_rule_delete(rule_id=rule_id, actor=Actor.for_user(request.user))


@admin.register(Approval)
class ApprovalAdmin(ReadOnlyAdmin):
    """Decided in the console or the API (`approval_decide`), never here."""

    list_display = [
        "public_id",
        "subject",
        "run",
        "team",
        "agent",
        "status",
        "risk",
        "rule_name",
        "requested_at",
        "deadline",
        "decided_by",
        "decided_at",
    ]
    list_filter = ["status", "risk", "target", "edited", "team"]
    search_fields = ["run__id", "subject", "agent", "rule_name", "decided_by"]
    list_select_related = ["run", "team"]
    date_hierarchy = "requested_at"


class BulkStopResultInline(admin.TabularInline):
    model = BulkStopResult
    fields = ("run_id", "outcome", "status", "stop_epoch", "stop_request", "detail")
    readonly_fields = fields
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


@admin.register(BulkStop)
class BulkStopAdmin(ReadOnlyAdmin):
    list_display = ["bulk_id", "requested_by", "reason", "requested", "created_at", "finished_at"]
    list_filter = ["reason", "actor_kind"]
    search_fields = ["bulk_id", "requested_by", "note", "idempotency_key"]
    date_hierarchy = "created_at"
    inlines = [BulkStopResultInline]


@admin.register(BulkStopPreview)
class BulkStopPreviewAdmin(ReadOnlyAdmin):
    list_display = ["preview_id", "actor_kind", "actor_id", "created_at"]
    search_fields = ["preview_id", "actor_id"]
    date_hierarchy = "created_at"


@admin.register(BulkStopResult)
class BulkStopResultAdmin(ReadOnlyAdmin):
    list_display = ["bulk", "run_id", "outcome", "status", "stop_epoch"]
    list_filter = ["outcome"]
    search_fields = ["run_id", "bulk__bulk_id"]
    list_select_related = ["bulk"]
