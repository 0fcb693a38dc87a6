"""The wire contract (DESIGN §5): one thin view per operation.

Each view: (1) checks access — the caller's team owns the run (else 404) and the caller's role
allows the operation (else 403), see `api.permissions`; (2) parses the body with a small
input serializer (400 names the bad field); (3) calls exactly one service, which raises a typed
`runs.errors` refusal (409 with the run's `status` and `stop_epoch`) for anything illegal;
(4) renders the answer with an output serializer. No view or serializer writes a model.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError as DjangoValidationError
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    PolymorphicProxySerializer,
    extend_schema,
)
from rest_framework import status
from rest_framework.exceptions import ValidationError
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.serializers import Serializer
from rest_framework.utils.encoders import JSONEncoder
from rest_framework.views import APIView

from api import selectors
from api import serializers as s
from api.events_fast import events_fast
from api.parsers import SafeJSONParser
from api.permissions import Caller, Capability, WrongRole, WrongTeam, run_for, run_id_for
from api.ratelimit import CallerRateThrottle, denials_list
from api.schema import ApiAutoSchema
from handoff import selectors as handoff_selectors
from handoff import services as handoff_services
from handoff.packets import interruption_packet
from runs import selectors as run_selectors
from runs import services
from runs.access import WHY_NOT, stop_refusals
from runs.errors import (
    AlreadyDecided,
    AlreadyFinished,
    ApprovalClosed,
    ApprovalVoid,
    DomainError,
    InvalidInput,
    NotFound,
)
from runs.models import (
    Approval,
    ApprovalRule,
    ApprovalStatus,
    ExecutionState,
    OutboxStatus,
    RunStatus,
    Team,
)
from runs.services import EventAnswer, PlannedStep, StopOutcome

# ---------------------------------------------------------------------------------------------
# shared mechanics


def _errors(*codes: int) -> dict[int, Any]:
    return {code: s.ErrorSerializer for code in codes}


# Every endpoint can answer these: unauthenticated, an agent client older than the contract
# (api.agent_version), rate limited, the database unreachable (api.errors).
_ALWAYS = (401, 426, 429, 503)
READ_ERRORS = _errors(*_ALWAYS, 403, 404)
WRITE_ERRORS = _errors(*_ALWAYS, 400, 403, 404, 409, 413, 415)

RUN_ID = OpenApiParameter(
    "run_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="run id, e.g. run_1a2b3c4d5e6f"
)
APPROVAL_ID = OpenApiParameter(
    "approval_id", OpenApiTypes.STR, OpenApiParameter.PATH, description="approval id, e.g. appr_12"
)


class ApiView(APIView):
    schema = ApiAutoSchema()
    parser_classes = [SafeJSONParser]
    throttle_classes = [CallerRateThrottle]
    caller: Caller

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authenticate, permit, rate limit
        self.caller = Caller.from_request(request)

    def parse(self, serializer_class: type[Serializer], data: Any = None) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data if data is None else data)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def run(self, run_id: str, capability: Capability) -> Any:
        return run_for(self.caller, run_id, capability)

    def work_run_id(self, run_id: str) -> str:
        """Access check for an agent write, which needs only the run's id (see `run_id_for`)."""
        return run_id_for(self.caller, run_id, Capability.WORK)


class _Page(CursorPagination):
    page_size = 50
    max_page_size = 500
    page_size_query_param = "limit"

    def get_page_size(self, request: Request) -> int:
        # DRF falls back to the default page size on any bad `limit`; the schema promises an
        # integer of at least 1, so anything else is refused. Blank means "not given".
        raw = request.query_params.get(self.page_size_query_param, "")
        if raw == "":
            return self.page_size
        if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
            raise ValidationError({"limit": "must be a whole number of at least 1"})
        return min(int(raw), self.max_page_size)

    def paginate_queryset(
        self, queryset: Any, request: Request, view: Any = None
    ) -> list[Any] | None:
        # A cursor is client text: a forged position ("p=garbage") fails in the ORM, not in
        # DRF's decoder, and must be a 404 like any other invalid cursor, not a 500.
        try:
            return super().paginate_queryset(queryset, request, view)
        except (ValueError, TypeError, OverflowError, DjangoValidationError):
            raise NotFound(self.invalid_cursor_message) from None

    def answer(
        self, queryset: Any, request: Request, view: Any, serializer: type[Serializer]
    ) -> Response:
        """The page, cut short once its JSON passes SAFESTOP_API_PAGE_MAX_BYTES (one item at
        least): `next` then continues from the first item left out, so a client reading every
        page misses nothing and a large `limit` never makes an unbounded answer."""
        page = self.paginate_queryset(queryset, request, view) or []
        items = [serializer(item).data for item in page]
        budget, kept = settings.SAFESTOP_API_PAGE_MAX_BYTES, 0
        for item in items:
            budget -= len(json.dumps(item, cls=JSONEncoder, ensure_ascii=False).encode()) + 1
            if budget < 0 and kept:
                break
            kept += 1
        if kept < len(items):
            first_left_out = page[kept]
            self.page = page[:kept]
            self.page_size = kept
            self.has_next = True
            self.next_position = self._get_position_from_instance(first_left_out, self.ordering)
        return self.get_paginated_response(items[:kept])


class RunPage(_Page):
    ordering = ("-created_at", "-id")


class LedgerPage(_Page):
    ordering = "-id"


class WaitingApprovalPage(_Page):
    ordering = ("deadline", "id")  # the inbox: soonest deadline first


class ApprovalPage(_Page):
    ordering = ("-requested_at", "-id")  # decided (or every status): newest first


PAGE_PARAMETERS = [
    OpenApiParameter(
        "cursor", OpenApiTypes.STR, description="opaque cursor from `next` / `previous`"
    ),
    OpenApiParameter(
        "limit",
        {"type": "integer", "minimum": 1},
        description="page size (default 50); larger than 500 reads 500",
    ),
]


def _stop_answer(outcome: StopOutcome) -> Response:
    if outcome.already_finished or outcome.stop_request is None:
        raise AlreadyFinished(
            f"the run already finished ({outcome.status}); nothing to stop",
            status=outcome.status,
            stop_epoch=outcome.stop_epoch,
        )
    body = s.StopOut(
        {
            "status": outcome.status,
            "stop_epoch": outcome.stop_epoch,
            "created": outcome.created,
            "stop_request": outcome.stop_request,
        }
    ).data
    return Response(body, status=status.HTTP_202_ACCEPTED)


# ---------------------------------------------------------------------------------------------
# approvals: access and answers


def approval_for(caller: Caller, approval_id: str, capability: Capability) -> Approval:
    """The approval, if the caller's team owns it (else 404, like one that does not exist) and
    the caller may `capability` on that team (else 403). Ids are `appr_<n>` (or `<n>`)."""
    missing = f"approval {approval_id[:40]!r} does not exist"
    # parse_approval_id bounds the number; ASCII only, or int() would read other scripts' digits
    if not approval_id.isascii() or len(approval_id) > 40:
        raise NotFound(missing)
    pk = services.parse_approval_id(approval_id)
    approval = (
        Approval.objects.select_related("team", "execution_record", "outbox_item")
        .filter(pk=pk)
        .first()
    )
    if approval is None:
        raise NotFound(missing)
    if not caller.may(Capability.READ, approval.team_id):
        raise WrongTeam(missing)
    if not caller.may(capability, approval.team_id):
        raise WrongRole(WHY_NOT.get(capability, "not allowed"))
    return approval


def _approval_reloaded(approval_id: int) -> Approval:
    return Approval.objects.select_related("team", "execution_record", "outbox_item").get(
        pk=approval_id
    )


def _with_approval_json(error: DomainError, approval_pk: int | None = None) -> DomainError:
    """A refusal about an approval carries it (`approval`), as the API shows approvals."""
    named = error.extra.get("approval_id")
    if approval_pk is None and isinstance(named, str):
        approval_pk = services.parse_approval_id(named)
    if approval_pk is not None:
        error.extra["approval"] = dict(s.ApprovalOut(_approval_reloaded(approval_pk)).data)
    return error


def _held_approval(obj: Any, *, created: bool, untouched: bool) -> Approval | None:
    """The approval a permit or outbox item went through. A record or item just made and
    `untouched` (permitted / pending) never had one: no query for the common case."""
    if created and untouched:
        return None
    approval: Approval | None = getattr(obj, "approval", None)  # reverse one-to-one
    return _approval_reloaded(approval.pk) if approval is not None else None


# ---------------------------------------------------------------------------------------------
# runs


class RunsView(ApiView):
    @extend_schema(
        operation_id="runs_list",
        summary="List the runs your team can see, newest first",
        parameters=[s.RunListQuery, *PAGE_PARAMETERS],
        responses={200: s.RunPageOut, **_errors(*_ALWAYS, 400, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.READ)
        query = self.parse(s.RunListQuery, request.query_params)
        runs = run_selectors.runs_for_teams(self.caller.team_ids(Capability.READ))
        if query.get("status"):
            runs = runs.filter(status=query["status"])
        paginator = RunPage()
        return paginator.answer(runs, request, self, s.RunOut)

    @extend_schema(
        operation_id="runs_create",
        summary="Create a run (agent or reviewer token)",
        request=s.RunCreateIn,
        responses={201: s.RunOut, 200: s.RunOut, **_errors(*_ALWAYS, 400, 403, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        self.caller.require(Capability.WORK)
        data = self.parse(s.RunCreateIn)
        budget = data.get("budget") or {}
        assert self.caller.token is not None  # WORK is a token capability
        run, created = services.run_create_or_get(
            team=self.caller.token.team,
            title=data["title"],
            agent=data["agent"],
            actor=self.caller.actor,
            steps=[PlannedStep(**step) for step in data.get("steps", [])],
            max_seconds=budget.get("max_seconds"),
            max_tool_calls=budget.get("max_tool_calls"),
            max_cost_usd=budget.get("max_cost_usd"),
            max_tokens=budget.get("max_tokens"),
            idempotency_key=data.get("idempotency_key", ""),
        )
        run = run_selectors.runs_for_teams(None).get(pk=run.pk)
        return Response(
            s.RunOut(run).data, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK
        )


class RunDetailView(ApiView):
    @extend_schema(
        operation_id="runs_retrieve",
        summary="One run",
        parameters=[RUN_ID],
        description="With `result`: what the agent gave `run.complete(...)` (`run.completed`), "
        "and `failure`: what it gave `run.fail(...)`.",
        responses={200: s.RunDetailOut, **READ_ERRORS},
    )
    def get(self, request: Request, run_id: str) -> Response:
        return Response(s.RunDetailOut(self.run(run_id, Capability.READ)).data)


# ---------------------------------------------------------------------------------------------
# leases


class LeaseAcquireView(ApiView):
    @extend_schema(
        operation_id="lease_acquire",
        summary="Acquire the run's lease (pending → running)",
        description="The lease carries the run's current epoch. 409 `lease_held` while another worker "
        "holds a live lease; 409 `run_not_running` if the run is not pending.",
        parameters=[RUN_ID],
        request=s.LeaseAcquireIn,
        responses={201: s.LeaseOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.LeaseAcquireIn)
        lease = services.lease_acquire(
            run_id=run_id,
            worker_id=data["worker_id"],
            ttl_seconds=data["ttl_seconds"],
            actor=self.caller.actor,
        )
        return Response(s.LeaseOut(lease).data, status=status.HTTP_201_CREATED)


class LeaseHeartbeatView(ApiView):
    @extend_schema(
        operation_id="lease_heartbeat",
        summary="Renew the lease; the answer carries the stop signal",
        description="`signal` is null, or the stop request: stop starting work, finish or abandon what is in "
        "flight, report `drained`. 409 `lease_revoked` once the run is stopped or the lease expired.",
        parameters=[RUN_ID],
        request=s.LeaseIn,
        responses={200: s.HeartbeatOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.LeaseIn)
        answer = services.lease_heartbeat(
            run_id=run_id,
            lease_token=data["lease_id"],
            epoch=data["epoch"],
            actor=self.caller.actor,
        )
        lease = answer.lease
        return Response(
            s.HeartbeatOut(
                {
                    "lease_id": lease.token,
                    "epoch": lease.epoch,
                    "expires_at": lease.expires_at,
                    "signal": answer.signal,
                }
            ).data
        )


class LeaseReleaseView(ApiView):
    @extend_schema(
        operation_id="lease_release",
        summary="Give the lease back",
        description="Releasing a running run's lease interrupts the run; during a stop it counts as drained "
        "with no observations. Releasing twice answers the first release. With `suspend: true` "
        "the run is `suspended` instead, its waiting approvals kept open for reviewers, and the "
        "next lease goes on at the same epoch (409 `illegal_transition` while calls are in "
        "flight or the run is not running).",
        parameters=[RUN_ID],
        request=s.LeaseReleaseIn,
        responses={200: s.LeaseReleaseOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.LeaseReleaseIn)
        lease = services.lease_release(
            run_id=run_id,
            lease_token=data["lease_id"],
            epoch=data["epoch"],
            actor=self.caller.actor,
            suspend=data["suspend"],
            reason=data.get("reason", ""),
        )
        state = selectors.run_state(run_id=run_id)
        return Response(
            s.LeaseReleaseOut(
                {
                    "lease_id": lease.token,
                    "released_at": lease.released_at,
                    "release_reason": lease.release_reason,
                    **state,
                }
            ).data
        )


# ---------------------------------------------------------------------------------------------
# tool calls


class PermitsView(ApiView):
    @extend_schema(
        operation_id="permits_create",
        summary="Ask to start one tool call (the intent record)",
        description="201 with the permit; 200 with the same permit when `tool_call_id` was already "
        "asked for the same `tool` with the same `arguments` at this epoch (a retry). The same "
        "`tool_call_id` with another `tool` or other `arguments` is **409 `tool_call_conflict`**: "
        "nothing is granted, and the answer names what the id was first asked for "
        "(`tool_call_id`, `first_tool`, `first_arguments`); give every call its own id (the "
        "framework's call id). 409 `stale_epoch` / `run_not_running` after a stop: the tool must "
        "not start.\n\n"
        "Approvals (DESIGN §10): when a team rule matches or `needs_approval` is true, the call "
        "waits for a reviewer: **202** `{tool_call_id, epoch, approval}` and no `permit_id` — do "
        "not start the call. Asking again (with the original arguments) answers 202 while it "
        "waits, 201 with the permit, the final (possibly edited) `arguments` and the `approval` "
        "once approved, and 409 `approval_closed` (with the `approval` and its `message`) once "
        "rejected, expired or void.",
        parameters=[RUN_ID],
        request=s.PermitIn,
        responses={
            201: s.PermitOut,
            200: s.PermitOut,
            202: s.PermitWaitingOut,
            **WRITE_ERRORS,
            409: OpenApiResponse(
                s.PermitRefusalOut,
                description="`stale_epoch`, `run_not_running`, `illegal_transition`, "
                "`approval_closed` or `tool_call_conflict` (with `first_tool` and "
                "`first_arguments`): the call must not start",
            ),
        },
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.PermitIn)
        epoch = data.pop("epoch")
        try:
            record, created = services.permit_request(
                run_id=run_id,
                epoch=epoch,
                actor=self.caller.actor,
                request=services.PermitRequest(**data),
            )
        except ApprovalClosed as error:
            raise _with_approval_json(error) from None
        state = record.execution_state
        approval = _held_approval(
            record, created=created, untouched=state == ExecutionState.PERMITTED
        )
        context = {"approval": approval}
        if state == ExecutionState.AWAITING_APPROVAL:
            return Response(
                s.PermitWaitingOut(record, context=context).data, status=status.HTTP_202_ACCEPTED
            )
        # A call that waited gets its permit now: the first answers for it had none.
        granted = created or approval is not None
        return Response(
            s.PermitOut(record, context=context).data,
            status=status.HTTP_201_CREATED if granted else status.HTTP_200_OK,
        )


class ToolResultView(ApiView):
    @extend_schema(
        operation_id="tool_result_report",
        summary="Report the outcome of a permitted tool call",
        description="Accepted after a stop too, as a fact (`reported_after_stop`). A verified success and a "
        "reviewer's resolution are never overwritten.",
        parameters=[
            RUN_ID,
            OpenApiParameter("tool_call_id", OpenApiTypes.STR, OpenApiParameter.PATH),
        ],
        request=s.ToolResultIn,
        responses={200: s.ToolCallOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str, tool_call_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        if len(tool_call_id) > 120 or "\x00" in tool_call_id:
            raise NotFound(f"tool call {tool_call_id[:120]!r} was never permitted on run {run_id}")
        data = self.parse(s.ToolResultIn)
        record = services.tool_result_report(
            run_id=run_id, tool_call_id=tool_call_id, actor=self.caller.actor, **data
        )
        return Response(s.ToolCallOut(record).data)


# ---------------------------------------------------------------------------------------------
# events, outbox, drain


class EventsView(ApiView):
    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        # A plain batch from an agent token skips DRF (api.events_fast, the hot path of
        # ingestion); everything else, and every refusal, is answered below as before.
        answer = events_fast(request, str(kwargs.get("run_id", "")))
        return answer if answer is not None else super().dispatch(request, *args, **kwargs)

    @extend_schema(
        operation_id="events_ingest",
        summary="Report a batch of events; each gets its own answer",
        description="Types: step.started, step.completed, step.failed, artifact.added, checkpoint.saved, "
        "steering.applied, run.suspended, run.completed, run.failed, usage (one model call's "
        "tokens: model, provider?, input_tokens, output_tokens, cache_read_tokens?, "
        "cache_write_tokens?, cost_usd?, step_key?). Each event is answered "
        "`accepted`, `duplicate` (its `event_id` was seen before) or `rejected` with a `code` "
        "(stale_epoch, run_not_running, unknown_event_type, unknown_step, invalid, ...). "
        f"At most {s.MAX_EVENTS_PER_BATCH} events per batch.",
        parameters=[RUN_ID],
        request=s.EventsIn,
        responses={200: s.EventsOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.EventsIn)
        # Field-level problems of one event are that event's rejection, not the batch's.
        slots: list[EventAnswer | None] = []
        valid: list[dict[str, Any]] = []
        for event in data["events"]:
            checked = s.EventIn(data=event)
            if checked.is_valid():
                valid.append(event)
                slots.append(None)
            else:
                field, messages = next(iter(checked.errors.items()))
                slots.append(
                    EventAnswer(
                        str(event["event_id"]), "rejected", "invalid", f"{field}: {messages[0]}"
                    )
                )
        answered = iter(
            services.events_ingest(
                run_id=run_id, epoch=data["epoch"], events=valid, actor=self.caller.actor
            )
            if valid
            else []
        )
        results = [slot or next(answered) for slot in slots]
        counts = {
            name: sum(1 for answer in results if answer.status == name)
            for name in ("accepted", "duplicate", "rejected")
        }
        return Response(
            s.EventsOut({"results": [answer.as_dict() for answer in results], **counts}).data
        )


class OutboxView(ApiView):
    @extend_schema(
        operation_id="outbox_enqueue",
        summary="Queue a side effect for the server to dispatch",
        description="201 with the item; 200 with the first item when `idempotency_key` was used before on "
        "this run. A webhook's destination must be on SAFESTOP_WEBHOOK_ALLOWED_HOSTS.\n\n"
        "Approvals (DESIGN §10): when a team rule matches or `needs_approval` is true, the item "
        "is `awaiting_approval` (with `approval`) and no dispatcher sends it until a reviewer "
        "approves (`pending`, with the final payload); a rejection or expiry discards it.",
        parameters=[RUN_ID],
        request=s.OutboxIn,
        responses={201: s.OutboxOut, 200: s.OutboxOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.OutboxIn)
        item, created = services.outbox_enqueue(run_id=run_id, actor=self.caller.actor, **data)
        approval = _held_approval(
            item, created=created, untouched=item.status != OutboxStatus.AWAITING_APPROVAL
        )
        return Response(
            s.OutboxOut(item, context={"approval": approval}).data,
            status=status.HTTP_201_CREATED if created else status.HTTP_200_OK,
        )


class DrainedView(ApiView):
    @extend_schema(
        operation_id="run_drained",
        summary="The worker says it has stopped",
        description="`epoch` is the lease's epoch. Observations are recorded as facts about tool calls, then "
        "the run settles to stopped_cleanly or stopped_dirty. A retry after it settled is a no-op.",
        parameters=[RUN_ID],
        request=s.DrainedIn,
        responses={200: s.RunOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run_id = self.work_run_id(run_id)
        data = self.parse(s.DrainedIn)
        # The answer is the run as the service left it, locked and settled: reading it again
        # after the commit cost the worker a round trip before `stopped_cleanly` reached it.
        run = services.run_drained(
            run_id=run_id,
            lease_token=data["lease_id"],
            epoch=data["epoch"],
            observations=data.get("observations", []),
            actor=self.caller.actor,
        )
        return Response(s.RunOut(run).data)


# ---------------------------------------------------------------------------------------------
# stop and reviewer actions


class CancelView(ApiView):
    @extend_schema(
        operation_id="run_cancel",
        summary="Stop the run",
        description="202 with the stop request; repeating it answers the same `stop_request.id` "
        "(`created: false`). 409 `already_finished` for a completed, failed or cancelled run. "
        "Agent tokens may stop their own team's runs only for budget_exhausted, timeout or "
        "dependency_failure; admin_kill needs an admin.",
        parameters=[RUN_ID],
        request=s.StopIn,
        responses={202: s.StopOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.STOP)
        data = self.parse(s.StopIn)
        self.caller.check_stop_reason(data["reason"], run.team_id)
        return _stop_answer(
            services.run_stop(
                run_id=run.pk, reason=data["reason"], note=data["note"], actor=self.caller.actor
            )
        )


class BulkStopView(ApiView):
    @extend_schema(
        operation_id="runs_bulk_stop",
        summary="Stop many runs at once (DESIGN §12), or preview it",
        description="A filter — `agent`, `team` (slug), `status`, `tool` (runs with a tool call of "
        "that tool), explicit `ids`, or `all: true` (every run of your teams) — selects the runs; "
        "every field given must match; naming none (and no `all: true`) is a 400. `dry_run: true` answers the preview (how many runs in which "
        "states, how many would be stopped) and stops nothing. Otherwise each selected run is "
        "stopped through the same stop service as `/cancel/`, in its own transaction (its own stop "
        "request, epoch bump and ledger entry naming the `bulk_id`), and the answer has one result "
        "per run: `stopped`, `already_stopping`, `already_stopped`, `already_finished` (a finished "
        "run is only listed when named in `ids`), `not_allowed` (your role, or the reason, may not "
        "stop that team's runs), `not_found` (an id that does not exist or is not yours), "
        "`failed`. Runs of teams you are not in are never touched. 201 for a new bulk stop, 200 "
        "for a retry with the same `idempotency_key` (the first one's answer). More than 10,000 "
        "runs to stop at once: 400 `bulk_too_large` unless `confirm: true`. A confirm naming "
        "`preview_id` stops exactly the previewed runs (runs that began to match since are "
        "counted in `new_since_preview`); another caller's preview is 404, one older than "
        "SAFESTOP_BULK_PREVIEW_SECONDS 409 `preview_expired`. Agent tokens stop "
        "only their team's runs, only for budget_exhausted, timeout or dependency_failure; "
        "admin_kill needs an admin (of each run's team).",
        request=s.BulkStopIn,
        responses={
            201: s.BulkStopOut,
            200: PolymorphicProxySerializer(
                component_name="BulkStopOrPreview",
                serializers=[s.BulkStopOut, s.BulkPreviewOut],
                resource_type_field_name=None,
            ),
            **_errors(*_ALWAYS, 400, 403, 404, 409, 413, 415),
        },
    )
    def post(self, request: Request) -> Response:
        self.caller.require(Capability.STOP)
        data = self.parse(s.BulkStopIn)
        team_ids = self.caller.team_ids(Capability.READ)
        refusals = stop_refusals(
            team_ids or [],
            reason=data["reason"],
            capabilities=self.caller.grants.on,
            token_role=self.caller.token.role if self.caller.token is not None else None,
        )
        if team_ids is not None and team_ids and set(refusals) >= set(team_ids):
            # Nothing this caller could stop with this reason: say why, as /cancel/ does.
            raise WrongRole(refusals[team_ids[0]])
        bulk_filter = services.BulkFilter(
            agent=data["agent"],
            team=data["team"],
            status=data["status"],
            tool=data["tool"],
            ids=tuple(data["ids"]),
            every_run=data["all"],
        )
        if data["dry_run"]:
            preview = services.bulk_stop_preview(
                team_ids=team_ids, filter=bulk_filter, refusals=refusals, actor=self.caller.actor
            )
            return Response(s.BulkPreviewOut(preview).data)
        answer = services.bulk_stop(
            preview_id=data["preview_id"],
            actor=self.caller.actor,
            team_ids=team_ids,
            filter=bulk_filter,
            reason=data["reason"],
            note=data["note"],
            idempotency_key=data["idempotency_key"],
            confirm_large=data["confirm"],
            refusals=refusals,
        )
        bulk = answer.bulk
        body = s.BulkStopOut(
            {
                **{name: getattr(bulk, name) for name in s.BulkStopOut.BULK_FIELDS},
                "results": answer.results,
            },
            context={"run_statuses": run_selectors.bulk_run_statuses(answer.results)},
        ).data
        return Response(
            body, status=status.HTTP_201_CREATED if answer.created else status.HTTP_200_OK
        )


class TakeoverView(ApiView):
    @extend_schema(
        operation_id="run_takeover",
        summary="Take over: stop, then hand the run to a human",
        description="A stop with reason manual_takeover that ends in handed_off once the run stopped cleanly "
        "(a stopped_dirty run stays so until its unknowns are resolved).",
        parameters=[RUN_ID],
        request=s.NoteIn,
        responses={202: s.StopOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.REVIEW)
        data = self.parse(s.NoteIn)
        return _stop_answer(
            services.run_takeover(run_id=run.pk, note=data["note"], actor=self.caller.actor)
        )


class ResumeView(ApiView):
    @extend_schema(
        operation_id="run_resume",
        summary="Back to pending at a new epoch",
        description="From stopped_cleanly, suspended, interrupted or handed_off, once nothing is unknown. "
        "`checkpoint` sets where to resume (one the run saved, else 400; blank: where it stopped); "
        "`carry_over_steering` keeps unapplied steering.",
        parameters=[RUN_ID],
        request=s.ResumeIn,
        responses={200: s.RunOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.REVIEW)
        data = self.parse(s.ResumeIn)
        services.run_resume(
            run_id=run.pk,
            checkpoint=data["checkpoint"],
            carry_over_steering=data["carry_over_steering"],
            note=data["note"],
            actor=self.caller.actor,
        )
        return Response(s.RunOut(self.run(run_id, Capability.READ)).data)


class CloseView(ApiView):
    @extend_schema(
        operation_id="run_close",
        summary="Close a stopped or handed-off run for good (cancelled)",
        parameters=[RUN_ID],
        request=s.NoteIn,
        responses={200: s.RunOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.REVIEW)
        data = self.parse(s.NoteIn)
        services.run_close(run_id=run.pk, note=data["note"], actor=self.caller.actor)
        return Response(s.RunOut(self.run(run_id, Capability.READ)).data)


class ResolutionsView(ApiView):
    @extend_schema(
        operation_id="resolutions_create",
        summary="Resolve one unknown side effect",
        description='`{"target": "tool_call", "id": <tool_call_id>}`, `{"target": "outbox", "id": "outbox_12"}` '
        'or `{"target": "worker", "id": <lease_id>}` for a worker fenced off without confirming. '
        "201 when recorded, 200 when the same decision was recorded before; 409 for a different one.",
        parameters=[RUN_ID],
        request=s.RESOLUTION_IN_SCHEMA,
        responses={201: s.ResolutionOut, 200: s.ResolutionOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.REVIEW)
        data = self.parse(s.ResolutionIn)
        result = handoff_services.resolution_record(
            run_id=run.pk,
            target=data["target"],
            target_id=data["id"],
            decision=data["decision"],
            evidence=data["evidence"],
            actor=self.caller.actor,
        )
        return Response(
            s.ResolutionOut(result).data,
            status=status.HTTP_201_CREATED if result.created else status.HTTP_200_OK,
        )


class SteeringView(ApiView):
    @extend_schema(
        operation_id="steering_create",
        summary="Queue a steering message for the agent",
        description="On a stopping or stopped run the message waits, unapplied, for the next round.",
        parameters=[RUN_ID],
        request=s.SteeringIn,
        responses={201: s.SteeringOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.REVIEW)
        data = self.parse(s.SteeringIn)
        message = services.steering_queue(run_id=run.pk, text=data["text"], actor=self.caller.actor)
        return Response(s.SteeringOut(message).data, status=status.HTTP_201_CREATED)


# ---------------------------------------------------------------------------------------------
# approvals


class ApprovalsView(ApiView):
    @extend_schema(
        operation_id="approvals_list",
        summary="The team's approvals: by default the waiting ones, soonest deadline first",
        description="The team's members (viewers, reviewers, admins) and reviewer tokens; "
        "agent tokens read their approvals one by one. `status` filters (default `waiting`, "
        "sorted by deadline; `all` or a decided status: newest first); `run`, `agent`, `risk` are "
        "exact, `tool` matches part of the tool name (or an outbox item's transport and "
        "destination).",
        parameters=[s.ApprovalListQuery, *PAGE_PARAMETERS],
        responses={200: s.ApprovalPageOut, **_errors(*_ALWAYS, 400, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.APPROVALS)
        query = self.parse(s.ApprovalListQuery, request.query_params)
        wanted = query["status"]
        approvals = run_selectors.approvals_list(
            team_ids=self.caller.team_ids(Capability.APPROVALS),
            status="" if wanted == "all" else wanted,
            agent=query.get("agent", ""),
            tool=query.get("tool", ""),
            risk=query.get("risk", ""),
            run_id=query.get("run", ""),
        )
        paginator = WaitingApprovalPage() if wanted == ApprovalStatus.WAITING else ApprovalPage()
        approvals = run_selectors.approvals_summarised(
            approvals, chars=settings.SAFESTOP_API_LIST_ARGUMENTS_CHARS
        )
        return paginator.answer(approvals, request, self, s.ApprovalListItemOut)


class ApprovalDetailView(ApiView):
    @extend_schema(
        operation_id="approvals_retrieve",
        summary="One approval",
        description="Anyone on the run's team, agent tokens included: a worker whose push socket "
        "is down polls this for the decision (`status`, `message`, final `arguments`, "
        "`permit_id`). Another team's approval is a 404.",
        parameters=[APPROVAL_ID],
        responses={200: s.ApprovalOut, **READ_ERRORS},
    )
    def get(self, request: Request, approval_id: str) -> Response:
        return Response(s.ApprovalOut(approval_for(self.caller, approval_id, Capability.READ)).data)


class ApprovalDecideView(ApiView):
    @extend_schema(
        operation_id="approvals_decide",
        summary="Approve (as is, or with edited arguments) or reject a waiting approval",
        description="Reviewer tokens, reviewers and admins (agent tokens and viewers: 403). "
        "200 with the approval; an approved tool call's carries its `permit_id`, an approved "
        "outbox item becomes `pending`. Edited `arguments` must be an object and match the "
        "approval's `arguments_schema` (400 naming the path otherwise); a rejection carries no "
        "`arguments` (400). A decision is taken "
        "once: 409 `already_decided` with the first (`approval_status`, `decided_by`, "
        "`decided_at`, `approval`) — a repeat of the same decision included; 409 "
        "`approval_void` once a stop, takeover or lease loss voided it; 409 `run_not_running` "
        "when the run is not running at the approval's epoch.",
        parameters=[APPROVAL_ID],
        request=s.ApprovalDecideIn,
        responses={200: s.ApprovalOut, **WRITE_ERRORS},
    )
    def post(self, request: Request, approval_id: str) -> Response:
        approval = approval_for(self.caller, approval_id, Capability.REVIEW)
        data = self.parse(s.ApprovalDecideIn)
        try:
            services.approval_decide(
                approval_id=approval.pk,
                decision=data["decision"],
                message=data["message"],
                arguments=data["arguments"],
                actor=self.caller.actor,
            )
        except (AlreadyDecided, ApprovalVoid) as error:
            raise _with_approval_json(error, approval.pk) from None
        return Response(s.ApprovalOut(_approval_reloaded(approval.pk)).data)


# ---------------------------------------------------------------------------------------------
# approval rules (DESIGN §10): team configuration, written by the team's admins


RULE_ID = OpenApiParameter(
    "rule_id", OpenApiTypes.INT, OpenApiParameter.PATH, description="approval rule id"
)


_RULE_WHY_NOT = {
    Capability.REVIEW: "approval rules are read by reviewers and admins (a reviewer token, or "
    "the reviewer or admin role)",
    Capability.ADMIN: "approval rules are written by the team's admins (the admin role; no "
    "token role holds it)",
}


def approval_rule_for(caller: Caller, rule_id: int, capability: Capability) -> ApprovalRule:
    """The rule, if the caller sees its team (else 404, like one that does not exist) and may
    `capability` there (else 403)."""
    missing = f"approval rule {rule_id} does not exist"
    # The path's digits are unbounded; the key is a 64-bit integer.
    rule = (
        ApprovalRule.objects.select_related("team").filter(pk=rule_id).first()
        if 0 < rule_id <= s.INT64_MAX
        else None
    )
    if rule is None:
        raise NotFound(missing)
    if not caller.may(Capability.READ, rule.team_id):
        raise WrongTeam(missing)
    if not caller.may(capability, rule.team_id):
        raise WrongRole(_RULE_WHY_NOT.get(capability, "not allowed"))
    return rule


def _rule_team(caller: Caller, slug: str | None) -> Team:
    """The team a new rule is for: the one named, or the caller's only administered team."""
    if slug is None:
        team_ids = caller.team_ids(Capability.ADMIN)
        if team_ids is not None and len(team_ids) == 1:
            return Team.objects.get(pk=team_ids[0])
        raise InvalidInput("team: name the team (its slug) the rule is for", field="team")
    team = Team.objects.filter(slug=slug).first()
    if team is None or not caller.may(Capability.READ, team.pk):
        raise NotFound(f"team {slug[:64]!r} does not exist")
    if not caller.may(Capability.ADMIN, team.pk):
        raise WrongRole(_RULE_WHY_NOT[Capability.ADMIN])
    return team


_RULE_RULES = (
    "Rules across fields, answered 400 naming the field: a rule for `tool_call`s cannot "
    "name a `transport` or `destination_glob`, one for `outbox` items cannot name a "
    "`tool_glob` or `side_effect`, and an `any` rule names one kind or the other, not both; "
    "`escalate_after_seconds` is less than `timeout_seconds`; a glob's `[` is closed; a "
    "team's rule names are unique. Unknown fields are refused by name."
)


class ApprovalRulesView(ApiView):
    @extend_schema(
        operation_id="approval_rules_list",
        summary="The approval rules of your teams, in the order they are tried",
        description="Reviewer tokens, reviewers and admins (agent tokens and viewers: 403). "
        "Per team, rules are tried by `position` (then age); the first enabled match holds the "
        "call or item for a reviewer.",
        parameters=[s.ApprovalRuleListQuery],
        responses={200: s.ApprovalRuleListOut, **_errors(*_ALWAYS, 400, 403)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.REVIEW)
        query = self.parse(s.ApprovalRuleListQuery, request.query_params)
        rules = run_selectors.approval_rules_list(
            team_ids=self.caller.team_ids(Capability.REVIEW), team_slug=query.get("team", "")
        )
        return Response({"results": s.ApprovalRuleOut(rules, many=True).data})

    @extend_schema(
        operation_id="approval_rules_create",
        summary="Create an approval rule (team admins)",
        description="Admins of the team (session users with the admin role, staff). 201 with "
        "the rule; the ledger records it (`approval_rule.created`, every field). " + _RULE_RULES,
        request=s.ApprovalRuleCreateIn,
        responses={201: s.ApprovalRuleOut, **_errors(*_ALWAYS, 400, 403, 404, 413, 415)},
    )
    def post(self, request: Request) -> Response:
        self.caller.require(Capability.ADMIN)
        data = self.parse(s.ApprovalRuleCreateIn)
        team = _rule_team(self.caller, data.pop("team", None))
        rule = services.approval_rule_create(team_id=team.pk, actor=self.caller.actor, **data)
        return Response(
            s.ApprovalRuleOut(approval_rule_for(self.caller, rule.pk, Capability.ADMIN)).data,
            status=status.HTTP_201_CREATED,
        )


class ApprovalRuleDetailView(ApiView):
    @extend_schema(
        operation_id="approval_rules_retrieve",
        summary="One approval rule",
        description="Reviewer tokens, reviewers and admins. Another team's rule is a 404.",
        parameters=[RULE_ID],
        responses={200: s.ApprovalRuleOut, **READ_ERRORS},
    )
    def get(self, request: Request, rule_id: int) -> Response:
        return Response(
            s.ApprovalRuleOut(approval_rule_for(self.caller, rule_id, Capability.REVIEW)).data
        )

    @extend_schema(
        operation_id="approval_rules_update",
        summary="Change some fields of an approval rule (team admins)",
        description="Only the fields given change; 200 with the rule. The ledger keeps each "
        "changed field's old and new value (`approval_rule.updated`); a PATCH that changes "
        "nothing writes nothing. Approvals already waiting keep the rule's name and reason "
        "as they were. " + _RULE_RULES,
        parameters=[RULE_ID],
        request=s.ApprovalRuleChangeIn,
        responses={200: s.ApprovalRuleOut, **_errors(*_ALWAYS, 400, 403, 404, 413, 415)},
    )
    def patch(self, request: Request, rule_id: int) -> Response:
        rule = approval_rule_for(self.caller, rule_id, Capability.ADMIN)
        data = self.parse(s.ApprovalRuleChangeIn)
        services.approval_rule_update(rule_id=rule.pk, actor=self.caller.actor, **data)
        return Response(
            s.ApprovalRuleOut(approval_rule_for(self.caller, rule.pk, Capability.ADMIN)).data
        )

    @extend_schema(
        operation_id="approval_rules_destroy",
        summary="Delete an approval rule (team admins)",
        description="204. The ledger keeps the deleted rule (`approval_rule.deleted`); "
        "approvals it held keep its name and reason.",
        parameters=[RULE_ID],
        responses={204: None, **_errors(*_ALWAYS, 403, 404)},
    )
    def delete(self, request: Request, rule_id: int) -> Response:
        rule = approval_rule_for(self.caller, rule_id, Capability.ADMIN)
        services.approval_rule_delete(rule_id=rule.pk, actor=self.caller.actor)
        return Response(status=status.HTTP_204_NO_CONTENT)


# ---------------------------------------------------------------------------------------------
# team budgets (DESIGN §13): team configuration, written by the team's admins

_BUDGET_WHY_NOT = {
    Capability.REVIEW: "a team's budget is read by reviewers and admins",
    Capability.ADMIN: "a team's budget is set by the team's admins (the admin role; no token "
    "role holds it)",
}


def _budget_team(caller: Caller, slug: str, capability: Capability) -> Team:
    team = Team.objects.filter(slug=slug[:64]).first()
    if team is None or not caller.may(Capability.READ, team.pk):
        raise NotFound(f"team {slug[:64]!r} does not exist")
    if not caller.may(capability, team.pk):
        raise WrongRole(_BUDGET_WHY_NOT[capability])
    return team


def _budget_answer(team: Team) -> Response:
    now = timezone.now()
    budget = run_selectors.team_budget_spent(team.pk, now=now)
    exhausted, _note = run_selectors.team_budget_refusal(team.pk, now=now)
    return Response(
        s.TeamBudgetOut(
            {
                "team": team.slug,
                "time_zone": budget.time_zone if budget else "UTC",
                "daily_usd": budget.daily_usd if budget else None,
                "monthly_usd": budget.monthly_usd if budget else None,
                "day": budget.day if budget else None,
                "day_spent_usd": budget.day_spent_usd if budget else 0,
                "month": budget.month if budget else None,
                "month_spent_usd": budget.month_spent_usd if budget else 0,
                "exhausted": exhausted,
                "updated_by": budget.updated_by if budget else "",
            }
        ).data
    )


TEAM_SLUG = OpenApiParameter(
    "slug", OpenApiTypes.STR, OpenApiParameter.PATH, description="team slug"
)


class TeamBudgetView(ApiView):
    @extend_schema(
        operation_id="team_budget_retrieve",
        summary="A team's daily and monthly budgets and what it spent in the current period",
        description="Reviewer tokens, reviewers and admins. Periods are days and months in the "
        "team's time zone; `exhausted` names a used-up budget (the team's permits then answer "
        "409 budget_exhausted).",
        parameters=[TEAM_SLUG],
        responses={200: s.TeamBudgetOut, **READ_ERRORS},
    )
    def get(self, request: Request, slug: str) -> Response:
        self.caller.require(Capability.REVIEW)
        return _budget_answer(_budget_team(self.caller, slug, Capability.REVIEW))

    @extend_schema(
        operation_id="team_budget_set",
        summary="Set a team's budgets (team admins)",
        description="Admins of the team. A field left out or null clears that budget. At 80 % "
        "a `budget.warning` goes through the notification channels (once per budget and "
        "period); at 100 % the run whose usage reached it is stopped (`budget_exhausted`, the "
        "budget named in its stop packet) and every permit of the team answers 409 "
        "`budget_exhausted` until an admin raises the budget or the period ends. Ledgered "
        "(`team_budget.changed`, old and new values). The current period's spend is counted "
        "from the usage rows.",
        parameters=[TEAM_SLUG],
        request=s.TeamBudgetIn,
        responses={200: s.TeamBudgetOut, **_errors(*_ALWAYS, 400, 403, 404, 413, 415)},
    )
    def put(self, request: Request, slug: str) -> Response:
        self.caller.require(Capability.ADMIN)
        team = _budget_team(self.caller, slug, Capability.ADMIN)
        data = self.parse(s.TeamBudgetIn)
        services.team_budget_set(
            team_id=team.pk,
            actor=self.caller.actor,
            time_zone=data.get("time_zone", "UTC"),
            daily_usd=data.get("daily_usd"),
            monthly_usd=data.get("monthly_usd"),
        )
        return _budget_answer(team)


# ---------------------------------------------------------------------------------------------
# stop packets


def _packet_answer(run: Any, packet: Any) -> Response:
    if packet is None:
        if run.status == RunStatus.INTERRUPTED or run.interruption:
            raise NotFound(
                f"run {run.pk} has no such stop packet: it was interrupted, not stopped "
                f"(see GET /api/v1/runs/{run.pk}/interruption-packet/)"
            )
        raise NotFound(f"run {run.pk} has no such stop packet (it has not stopped at that epoch)")
    body = {
        **packet.snapshot,
        "packet_created_at": packet.created_at.isoformat(),
        "run_status": run.status,
        "resolutions": selectors.resolutions_for(run=run),
    }
    return Response(body)


class StopPacketView(ApiView):
    @extend_schema(
        operation_id="stop_packet_latest",
        summary="The latest stop packet (DESIGN §4)",
        parameters=[RUN_ID],
        responses={200: s.StopPacketOut, **READ_ERRORS},
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.READ)
        return _packet_answer(run, selectors.stop_packet_get(run=run))


class StopPacketEpochView(ApiView):
    @extend_schema(
        operation_id="stop_packet_for_epoch",
        summary="The stop packet of an older stop epoch",
        parameters=[RUN_ID, OpenApiParameter("epoch", OpenApiTypes.INT, OpenApiParameter.PATH)],
        responses={200: s.StopPacketOut, **READ_ERRORS},
    )
    def get(self, request: Request, run_id: str, epoch: int) -> Response:
        run = self.run(run_id, Capability.READ)
        packet = (
            selectors.stop_packet_get(run=run, epoch=epoch) if 0 <= epoch <= s.INT32_MAX else None
        )
        return _packet_answer(run, packet)


class InterruptionPacketView(ApiView):
    @extend_schema(
        operation_id="interruption_packet",
        summary="An interrupted run's packet: the interruption point and its unknowns",
        description=(
            "The stop packet's lists (DESIGN §4), read now rather than stored — an interruption "
            "is not a stop and bumps no epoch — with `interruption` (reason, detail, at, current "
            "step, calls in flight, frozen outbox count, outbox in flight, worker id), "
            "`dirty_reasons` (what is unknown now; resume is refused while one holds) and the "
            "`resolutions` recorded since. Resolve each unknown with `POST .../resolutions/`. "
            "404 when the run is not interrupted."
        ),
        parameters=[RUN_ID],
        responses={200: s.InterruptionPacketOut, **READ_ERRORS},
    )
    def get(self, request: Request, run_id: str) -> Response:
        run = self.run(run_id, Capability.READ)
        if run.status != RunStatus.INTERRUPTED:
            raise NotFound(
                f"run {run.pk} is not interrupted (it is {run.status}): it has no interruption "
                "packet"
            )
        body = {
            **interruption_packet(run),
            "run_status": run.status,
            "resolutions": selectors.resolutions_for(run=run),
        }
        return Response(body)


# ---------------------------------------------------------------------------------------------
# audit and metrics


def _period(query: dict[str, Any], *, default: timedelta) -> tuple[datetime, datetime]:
    until = query.get("until") or timezone.now()
    since = query.get("since")
    if since is None:
        try:
            since = until - default
        except OverflowError:
            since = datetime.min.replace(tzinfo=until.tzinfo)
    if since >= until:
        raise ValidationError({"since": "since must be before until (which defaults to now)"})
    return since, until


class LedgerView(ApiView):
    @extend_schema(
        operation_id="ledger_list",
        summary="Audit entries, newest first",
        description="Reviewer tokens and reviewers read their teams' entries; staff read all. "
        "`actor` is the username or the token's name. `since` must be before `until` (400).",
        parameters=[s.LedgerQuery, *PAGE_PARAMETERS],
        responses={200: s.LedgerPageOut, **_errors(*_ALWAYS, 400, 403, 404)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.AUDIT)
        query = self.parse(s.LedgerQuery, request.query_params)
        entries = selectors.ledger_entries(
            team_slugs=self.caller.team_slugs(Capability.AUDIT),
            run_id=query.get("run"),
            actor=query.get("actor"),
            action=query.get("action"),
            since=query.get("since"),
            until=query.get("until"),
        )
        paginator = LedgerPage()
        return paginator.answer(entries, request, self, s.LedgerEntryOut)


class StopQualityView(ApiView):
    @extend_schema(
        operation_id="metrics_stop_quality",
        summary="The five stop-quality figures (DESIGN §7)",
        description="For stops requested in [since, until); default: the last 24 hours. Scoped to your teams. "
        "`since` must be before `until` (400).",
        parameters=[s.PeriodQuery],
        responses={200: s.StopQualityOut, **_errors(*_ALWAYS, 400, 403)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.READ)
        since, until = _period(
            self.parse(s.PeriodQuery, request.query_params), default=timedelta(hours=24)
        )
        figures = handoff_selectors.stop_quality(
            since=since, until=until, team_ids=self.caller.team_ids(Capability.READ)
        )
        return Response(s.StopQualityOut(figures).data)


class DenialsView(ApiView):
    @extend_schema(
        operation_id="security_denials",
        summary="Denied API attempts, counted per minute (admins)",
        description="Bad or revoked tokens, another team's run, a role that may not do it. Team admins see "
        "their teams'; staff see all, including attempts no team can be named for. Default: last 24h; "
        "`since` must be before `until` (400).",
        parameters=[s.PeriodQuery],
        responses={200: s.DenialsOut, **_errors(*_ALWAYS, 400, 403)},
    )
    def get(self, request: Request) -> Response:
        self.caller.require(Capability.ADMIN)
        since, until = _period(
            self.parse(s.PeriodQuery, request.query_params), default=timedelta(hours=24)
        )
        return Response(
            s.DenialsOut(
                denials_list(
                    team_slugs=self.caller.team_slugs(Capability.ADMIN), since=since, until=until
                )
            ).data
        )
