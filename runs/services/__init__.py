"""Every write to a run and its children: one function per transition of DESIGN §2.

Each public function:
1. opens `locked_run(run_id)`: `transaction.atomic(durable=True)` whose first query locks the run
   row, so the stop, a permit, a dispatch claim and a completion on one run are serialised —
   there is no gap between "checked: still running" and "started the tool";
2. re-checks the status and epoch and raises a typed `runs.errors` error for anything illegal
   (`SomeError.for_run(run, detail)` carries the run's status and epoch into the answer);
3. bumps `stop_epoch` where DESIGN says so (stop, takeover, resume);
4. writes its ledger entry in the same transaction;
5. publishes "run changed" on commit (`runs.notify`), never while the lock is held.

Lock order everywhere: run, then its children (lease, execution records, outbox items).

One module per record family; callers import from here (`from runs import services`). The
`*_locked` names and `run_move` / `run_mark_changed` are for code that already holds the run lock
inside `locked_run` (handoff's own transitions).
"""

from __future__ import annotations

from runs.services._base import (
    TRANSITIONS,
    locked_run,
    run_mark_changed,
    run_move,
)
from runs.services.approval_rules import (
    APPROVAL_RULE_FIELDS,
    approval_rule_create,
    approval_rule_delete,
    approval_rule_update,
    approval_rule_validate,
)
from runs.services.approvals import (
    approval_decide,
    approval_escalate,
    approval_expire,
    parse_approval_id,
)
from runs.services.budget import run_enforce_budget
from runs.services.bulk import (
    BULK_STOP_REASONS,
    bulk_stop,
    bulk_stop_workers,
)
from runs.services.bulk_preview import (
    MAX_BULK_IDS,
    RUN_ID_PATTERN,
    BulkFilter,
    bulk_stop_limit,
    bulk_stop_preview,
)
from runs.services.create import (
    PlannedStep,
    run_create,
    run_create_or_get,
)
from runs.services.events import (
    EventAnswer,
    events_ingest,
)
from runs.services.leases import (
    lease_acquire,
    lease_expire,
    lease_heartbeat,
    lease_release,
)
from runs.services.lifecycle import (
    SignalDelivery,
    StopOutcome,
    run_acknowledge_stop,
    run_drained,
    run_fence_overdue,
    run_stop,
    run_takeover,
    stop_signal_delivered,
)
from runs.services.outbox import (
    OUTBOX_OUTCOMES,
    TRANSPORTS,
    outbox_claim,
    outbox_claim_next,
    outbox_discard,
    outbox_enqueue,
    outbox_reap_stuck,
    outbox_record_outcome,
    outbox_release,
    parse_outbox_id,
    validate_outbox_destination,
)
from runs.services.relabel import (
    RELABEL_BATCH,
    outbox_relabel_frozen,
)
from runs.services.resolutions import (
    RESOLVABLE_STATUSES,
    resolution_apply,
)
from runs.services.resume import (
    RESUMABLE_STATUSES,
    run_close,
    run_close_locked,
    run_resume,
    run_resume_locked,
)
from runs.services.steering import (
    steering_decide,
    steering_queue,
)
from runs.services.team_budgets import (
    team_budget_charge,
    team_budget_set,
    team_price_delete,
    team_price_set,
)
from runs.services.tool_calls import (
    PermitRequest,
    permit_request,
    tool_result_report,
)

__all__ = [
    "team_budget_charge",
    "team_budget_set",
    "team_price_delete",
    "team_price_set",
    "BULK_STOP_REASONS",
    "MAX_BULK_IDS",
    "RUN_ID_PATTERN",
    "BulkFilter",
    "bulk_stop",
    "bulk_stop_limit",
    "bulk_stop_preview",
    "bulk_stop_workers",
    "APPROVAL_RULE_FIELDS",
    "approval_rule_create",
    "approval_rule_delete",
    "approval_rule_update",
    "approval_rule_validate",
    "approval_decide",
    "approval_escalate",
    "approval_expire",
    "parse_approval_id",
    "EventAnswer",
    "OUTBOX_OUTCOMES",
    "PlannedStep",
    "RESOLVABLE_STATUSES",
    "RESUMABLE_STATUSES",
    "StopOutcome",
    "TRANSITIONS",
    "TRANSPORTS",
    "events_ingest",
    "lease_acquire",
    "lease_expire",
    "lease_heartbeat",
    "lease_release",
    "locked_run",
    "outbox_claim",
    "outbox_claim_next",
    "outbox_discard",
    "outbox_enqueue",
    "outbox_reap_stuck",
    "outbox_record_outcome",
    "outbox_release",
    "outbox_relabel_frozen",
    "RELABEL_BATCH",
    "parse_outbox_id",
    "PermitRequest",
    "permit_request",
    "resolution_apply",
    "run_acknowledge_stop",
    "SignalDelivery",
    "run_close",
    "run_close_locked",
    "run_create",
    "run_create_or_get",
    "run_drained",
    "run_enforce_budget",
    "run_fence_overdue",
    "run_mark_changed",
    "run_move",
    "run_resume",
    "run_resume_locked",
    "run_stop",
    "run_takeover",
    "steering_decide",
    "steering_queue",
    "stop_signal_delivered",
    "tool_result_report",
    "validate_outbox_destination",
]
