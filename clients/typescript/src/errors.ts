/** Errors the server answers with, and the ones the client raises, as classes to branch on. */

import type { ApprovalStatus, JsonObject, StopSignal } from "./types.js";

/**
 * 409 codes that mean "the server refuses to let this work start or move on": the run was
 * stopped, the epoch is stale or the lease is gone. Decisions, never retried.
 */
export const REFUSAL_CODES: ReadonlySet<string> = new Set([
  "stale_epoch",
  "run_not_running",
  "lease_revoked",
  "illegal_transition",
]);

/** A non-2xx answer: `{"error": code, "detail": ..., "status"?, "stop_epoch"?}`. */
export class ApiError extends Error {
  override name = "ApiError";
  readonly status: number;
  readonly code: string;
  readonly detail: string;
  readonly body: unknown;

  constructor(status: number, code: string, detail: string, body: unknown) {
    super(`${status} ${code}: ${detail}`);
    this.status = status;
    this.code = code;
    this.detail = detail;
    this.body = body;
  }

  /** The run's current status, when the server included it. */
  get runStatus(): string | undefined {
    const value = this.field("status");
    return typeof value === "string" ? value : undefined;
  }

  /** The run's current epoch, when the server included it. */
  get stopEpoch(): number | undefined {
    const value = this.field("stop_epoch");
    return typeof value === "number" ? value : undefined;
  }

  /** Worth retrying: server errors and rate limiting. */
  get isTransient(): boolean {
    return this.status >= 500 || this.status === 408 || this.status === 429;
  }

  protected field(name: string): unknown {
    const body = this.body;
    return body !== null && typeof body === "object" && !Array.isArray(body)
      ? (body as Record<string, unknown>)[name]
      : undefined;
  }
}

/** 409 refusal: the run is stopped, the epoch is stale or the lease was revoked. */
export class Refused extends ApiError {
  override name = "Refused";
}

/**
 * `409 tool_call_conflict`: this `toolCallId` was first asked for another tool or other
 * arguments. The server granted nothing and names the first ask. Not a stop, never retried: two
 * calls were given one id (derive it from the framework's call id, never from a position).
 */
export class ToolCallConflict extends ApiError {
  override name = "ToolCallConflict";
  static readonly CODE = "tool_call_conflict";

  get toolCallId(): string | undefined {
    const value = this.field("tool_call_id");
    return typeof value === "string" ? value : undefined;
  }

  get firstTool(): string | undefined {
    const value = this.field("first_tool");
    return typeof value === "string" ? value : undefined;
  }

  /** The arguments the id was first asked with, as the server sent them. */
  get firstArguments(): unknown {
    return this.field("first_arguments");
  }
}

/** `426 client_too_old`: the server needs a newer client than this one. */
export class ClientTooOld extends ApiError {
  override name = "ClientTooOld";
  static readonly CODE = "client_too_old";

  get minimumVersion(): string | undefined {
    const value = this.field("minimum_version");
    return typeof value === "string" ? value : undefined;
  }
}

/** No answer at all (connection refused, reset, timed out): "no answer", never "no". */
export class TransportError extends Error {
  override name = "TransportError";
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
  }
}

/**
 * The stop, as the `reason` of `run.signal`: who stopped the run, why, at which epoch. Code
 * that awaits something with `run.signal` rejects with this (fetch, timers/promises, child
 * processes), and a tool call or step refused after the stop throws it.
 */
export class RunStoppedError extends Error {
  override name = "RunStoppedError";
  /** `user_stop`, `manual_takeover`, `budget_exhausted`, ... or how the client learnt of it (`lease_revoked`, `stale_epoch`). */
  readonly reason: string;
  readonly stopEpoch: number | undefined;
  readonly requestedBy: string | undefined;
  readonly stopRequestId: string | undefined;
  readonly requestedAt: string | undefined;
  /** `push`, `heartbeat`, or `refusal` (a permit, event or heartbeat the server refused). */
  readonly via: "push" | "heartbeat" | "refusal";
  /** The signal as the server sent it, when it came as one. */
  readonly signal: StopSignal | undefined;

  constructor(init: {
    reason: string;
    via: "push" | "heartbeat" | "refusal";
    stopEpoch?: number | undefined;
    requestedBy?: string | undefined;
    stopRequestId?: string | undefined;
    requestedAt?: string | undefined;
    signal?: StopSignal | undefined;
  }) {
    super(`run stopped (${init.reason}${init.requestedBy ? ` by ${init.requestedBy}` : ""})`);
    this.reason = init.reason;
    this.via = init.via;
    this.stopEpoch = init.stopEpoch;
    this.requestedBy = init.requestedBy;
    this.stopRequestId = init.stopRequestId;
    this.requestedAt = init.requestedAt;
    this.signal = init.signal;
  }
}

/**
 * A reviewer did not approve: the call never started and never will. `status` is `rejected`
 * (a reviewer said no), `expired` (no decision before the deadline) or `void` (a stop,
 * takeover or lost lease ended the wait). `message` is the reviewer's text for the model.
 */
export class ApprovalRejectedError extends Error {
  override name = "ApprovalRejectedError";
  readonly reviewerMessage: string;
  readonly status: Exclude<ApprovalStatus, "waiting" | "approved">;
  readonly approvalId: string | undefined;
  readonly approval: JsonObject;

  constructor(
    reviewerMessage: string,
    status: Exclude<ApprovalStatus, "waiting" | "approved">,
    approval: JsonObject,
  ) {
    super(reviewerMessage ? `approval ${status}: ${reviewerMessage}` : `approval ${status}`);
    this.reviewerMessage = reviewerMessage;
    this.status = status;
    this.approval = approval;
    const id = approval["approval_id"] ?? approval["id"];
    this.approvalId = typeof id === "string" ? id : undefined;
  }
}

/** A permit answer without a `permit_id` and nothing to wait for: the call fails closed. */
export class NoPermitError extends Error {
  override name = "NoPermitError";
  readonly answer: unknown;
  constructor(answer: unknown) {
    super(`no permit_id in the permit answer: ${JSON.stringify(answer)}`.slice(0, 500));
    this.answer = answer;
  }
}
