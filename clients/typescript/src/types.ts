/** The wire contract (DESIGN §5, §10) as TypeScript types. The server may add fields. */

export type JsonPrimitive = string | number | boolean | null;
export type JsonValue = JsonPrimitive | JsonValue[] | { [key: string]: JsonValue };
export type JsonObject = { [key: string]: JsonValue };

export type SideEffect = "none" | "write";
export type ExecutionState = "running" | "succeeded" | "failed" | "not_started" | "unknown";
export type RemoteCancelState = "not_requested" | "requested" | "confirmed" | "refused";
export type RecoveryPolicy =
  | "query_original"
  | "reuse_idempotency_key"
  | "manual_confirmation"
  | "compensate";
export type StopReason =
  | "user_stop"
  | "manual_takeover"
  | "budget_exhausted"
  | "timeout"
  | "admin_kill"
  | "dependency_failure"
  | "lease_expired"
  | "drain_deadline";
export type Risk = "low" | "medium" | "high";
export type ApprovalStatus = "waiting" | "approved" | "rejected" | "expired" | "void";
export type StepKind = "model_call" | "tool_read" | "tool_write" | "external_action";

export interface StepPlan {
  key: string;
  name?: string;
  kind?: StepKind;
}

export interface Budget {
  max_seconds?: number;
  max_tool_calls?: number;
}

export interface RunInfo {
  id: string;
  title: string;
  agent: string;
  team?: string;
  status: string;
  stop_epoch: number;
  stop_reason: string | null;
  resume_from: string | null;
  /** What `run.complete(...)` was given (`getRun` only; null until completed). */
  result?: JsonValue;
  /** What `run.fail(...)` was given (`getRun` only). */
  failure?: JsonValue;
  [field: string]: JsonValue | undefined;
}

export interface LeaseInfo {
  lease_id: string;
  epoch: number;
  expires_at: string;
  worker_id?: string;
  ttl_seconds?: number;
}

/** `{type: "cancel_requested", ...}`: on the heartbeat and pushed on the agent socket. */
export interface StopSignal {
  type: "cancel_requested";
  reason: string;
  requested_by: string;
  stop_epoch: number;
  stop_request_id?: string;
  requested_at?: string;
  run_id?: string;
}

export interface HeartbeatAnswer {
  lease_id: string;
  epoch: number;
  expires_at: string;
  signal: StopSignal | null;
}

export interface ApprovalInfo {
  id: string;
  run_id: string;
  epoch: number;
  target: "tool_call" | "outbox";
  tool_call_id: string | null;
  outbox_id: string | null;
  tool: string;
  status: ApprovalStatus;
  rule: string | null;
  match_reason: string;
  summary: string;
  risk: Risk | string;
  original_arguments: JsonValue;
  arguments: JsonValue;
  edited: boolean;
  arguments_schema: JsonValue;
  message: string;
  decided_by: string | null;
  decided_at: string | null;
  requested_at: string;
  deadline: string | null;
  permit_id: string | null;
  [field: string]: JsonValue | undefined;
}

/**
 * A permit (`201`), or a `202` that waits for `approval` and has no `permit_id` yet.
 * Never start a call without a `permit_id`.
 */
export interface PermitAnswer {
  permit_id?: string;
  tool_call_id: string;
  epoch: number;
  arguments?: JsonValue;
  approval?: ApprovalInfo;
  execution_state?: string;
  idempotency_key?: string | null;
}

/** `{"type": "approval.decided", ...}` pushed on the agent socket the moment a decision commits. */
export interface ApprovalDecidedFrame {
  type: "approval.decided";
  approval_id: string;
  tool_call_id: string | null;
  outbox_id: string | null;
  decision: "approve" | "reject" | "expire" | "void";
  status: ApprovalStatus;
  arguments: JsonValue;
  message: string;
  permit_id: string | null;
  epoch: number;
  run_id?: string;
}

export interface StopAnswer {
  status: string;
  stop_epoch: number;
  created: boolean;
  stop_request: {
    id: string;
    reason: string;
    requested_by: string;
    requested_at: string;
    note: string;
    takeover: boolean;
  };
}

/** One event to send: `event_id` and `type`, plus its fields (DESIGN §5 events). */
export interface WireEvent {
  event_id: string;
  type: string;
  [field: string]: JsonValue;
}

export interface EventAnswer {
  event_id: string;
  status: "accepted" | "duplicate" | "rejected" | "unsent";
  code?: string;
  detail?: string;
}

export interface EventsAnswer {
  results: EventAnswer[];
  accepted: number;
  duplicate: number;
  rejected: number;
}

export interface ToolResultReport {
  execution_state: ExecutionState;
  operation_id?: string;
  observation?: string;
  output_truncated?: boolean;
  remote_cancel_state?: RemoteCancelState;
  recovery_action?: string;
}
