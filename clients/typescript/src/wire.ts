/**
 * One HTTP client for the wire contract (DESIGN §5, §10): one method per endpoint, the
 * platform's `fetch`, a bearer token. Non-2xx answers throw `ApiError` (409 stop/stale/revoked
 * refusals throw its subclass `Refused`, 426 throws `ClientTooOld`); no answer at all throws
 * `TransportError`, so callers can tell "no answer" from "no".
 */

import {
  ApiError,
  ClientTooOld,
  REFUSAL_CODES,
  Refused,
  ToolCallConflict,
  TransportError,
} from "./errors.js";
import type {
  ApprovalInfo,
  ApprovalStatus,
  Budget,
  EventsAnswer,
  HeartbeatAnswer,
  JsonObject,
  JsonValue,
  LeaseInfo,
  PermitAnswer,
  RecoveryPolicy,
  Risk,
  RunInfo,
  SideEffect,
  StepPlan,
  StopAnswer,
  StopReason,
  ToolResultReport,
  WireEvent,
} from "./types.js";
import { USER_AGENT, VERSION, VERSION_HEADER } from "./version.js";

export interface WireClientOptions {
  /** The server, e.g. `http://127.0.0.1:8000`. */
  baseUrl: string;
  /** A raw API token (`ss_...`): `manage.py create_api_token --team T --name N --role agent`. */
  token: string;
  /** Per request, milliseconds (default 10 000). */
  timeoutMs?: number;
}

export interface CreateRunInput {
  title: string;
  agent: string;
  steps?: StepPlan[];
  budget?: Budget;
  /** A retried create with the same key answers the first run. */
  idempotencyKey?: string;
}

export interface PermitRequest {
  epoch: number;
  tool_call_id: string;
  tool: string;
  side_effect: SideEffect;
  arguments: JsonValue;
  idempotency_key?: string;
  operation_id?: string;
  recovery_policy?: RecoveryPolicy;
  step_key?: string;
  needs_approval?: boolean;
  summary?: string;
  risk?: Risk;
  arguments_schema?: JsonObject;
}

export interface OutboxRequest {
  epoch: number;
  transport: "webhook" | "email";
  destination: string;
  payload: JsonValue;
  idempotency_key: string;
  tool_call_id?: string;
  needs_approval?: boolean;
  summary?: string;
  risk?: Risk;
  arguments_schema?: JsonObject;
}

/** An outbox item; `status` is `awaiting_approval` (with `approval`) while a reviewer decides. */
export interface OutboxItem {
  id: string;
  status: string;
  idempotency_key: string;
  approval?: ApprovalInfo;
}

export class WireClient {
  readonly baseUrl: string;
  readonly token: string;
  readonly timeoutMs: number;

  constructor(options: WireClientOptions) {
    this.baseUrl = options.baseUrl.replace(/\/+$/, "");
    this.token = options.token;
    this.timeoutMs = options.timeoutMs ?? 10_000;
  }

  /** The headers every request (and the agent socket's handshake) carries. */
  headers(): Record<string, string> {
    return {
      Authorization: `Bearer ${this.token}`,
      Accept: "application/json",
      "User-Agent": USER_AGENT,
      [VERSION_HEADER]: VERSION,
    };
  }

  // -- runs --------------------------------------------------------------------------------

  createRun(input: CreateRunInput): Promise<RunInfo> {
    const body: JsonObject = { title: input.title, agent: input.agent };
    if (input.steps) body["steps"] = input.steps.map((step) => ({ ...step }));
    if (input.budget) body["budget"] = { ...input.budget };
    if (input.idempotencyKey) body["idempotency_key"] = input.idempotencyKey;
    return this.request("POST", "/api/v1/runs/", body);
  }

  getRun(runId: string): Promise<RunInfo> {
    return this.request("GET", runPath(runId));
  }

  // -- lease -------------------------------------------------------------------------------

  acquireLease(runId: string, workerId: string, ttlSeconds = 30): Promise<LeaseInfo> {
    return this.request("POST", runPath(runId, "lease/"), {
      worker_id: workerId,
      ttl_seconds: ttlSeconds,
    });
  }

  heartbeat(runId: string, leaseId: string, epoch: number): Promise<HeartbeatAnswer> {
    return this.request("POST", runPath(runId, "lease/heartbeat/"), { lease_id: leaseId, epoch });
  }

  /**
   * Give the lease back. `{suspend: true}`: the run is suspended to wait for reviewers (its
   * waiting approvals stay open; the next lease goes on at the same epoch), not interrupted.
   */
  releaseLease(runId: string, leaseId: string, epoch: number, options: { suspend?: boolean; reason?: string } = {}): Promise<JsonObject> {
    const body: JsonObject = { lease_id: leaseId, epoch };
    if (options.suspend) {
      body["suspend"] = true;
      if (options.reason) body["reason"] = options.reason;
    }
    return this.request("POST", runPath(runId, "lease/release/"), body);
  }

  // -- work --------------------------------------------------------------------------------

  /** Ask to start one tool call; a `202` answer has no `permit_id` and waits for `approval`. */
  requestPermit(runId: string, permit: PermitRequest): Promise<PermitAnswer> {
    return this.request("POST", runPath(runId, "permits/"), dropUndefined({ ...permit }));
  }

  reportToolResult(runId: string, toolCallId: string, report: ToolResultReport): Promise<JsonObject> {
    const path = runPath(runId, `tool-calls/${encodeURIComponent(toolCallId)}/result/`);
    return this.request("POST", path, dropUndefined({ ...report }));
  }

  sendEvents(runId: string, epoch: number, events: WireEvent[]): Promise<EventsAnswer> {
    return this.request("POST", runPath(runId, "events/"), { epoch, events });
  }

  /** Hand a side effect to the server to dispatch; it may wait in `awaiting_approval` first. */
  enqueueOutbox(runId: string, item: OutboxRequest): Promise<OutboxItem> {
    return this.request("POST", runPath(runId, "outbox/"), dropUndefined({ ...item }));
  }

  /** The worker says it stopped; `epoch` is the lease's epoch, not the new stop epoch. */
  drained(
    runId: string,
    leaseId: string,
    epoch: number,
    observations: JsonObject[],
    stopEpoch?: number,
  ): Promise<RunInfo> {
    return this.request(
      "POST",
      runPath(runId, "drained/"),
      dropUndefined({ lease_id: leaseId, epoch, observations, stop_epoch: stopEpoch }),
    );
  }

  // -- reviewer actions --------------------------------------------------------------------

  cancel(runId: string, reason: StopReason = "user_stop", note = ""): Promise<StopAnswer> {
    return this.request("POST", runPath(runId, "cancel/"), { reason, note });
  }

  stopPacket(runId: string, epoch?: number): Promise<JsonObject> {
    return this.request("GET", runPath(runId, epoch === undefined ? "stop-packet/" : `stop-packets/${epoch}/`));
  }

  getApproval(approvalId: string): Promise<ApprovalInfo> {
    return this.request("GET", approvalPath(approvalId));
  }

  /** Reviewers: one page of the team's approvals (default: the waiting ones). */
  async listApprovals(filters: { status?: ApprovalStatus | "all"; run?: string; agent?: string } = {}): Promise<ApprovalInfo[]> {
    const query = new URLSearchParams(dropUndefined({ ...filters }) as Record<string, string>);
    const suffix = query.size ? `?${query}` : "";
    const page = await this.request<{ results: ApprovalInfo[] }>("GET", `/api/v1/approvals/${suffix}`);
    return page.results;
  }

  /** Reviewers: approve (with edited `arguments` if given) or reject with a `message`. */
  decideApproval(
    approvalId: string,
    decision: "approve" | "reject",
    options: { message?: string; arguments?: JsonObject } = {},
  ): Promise<ApprovalInfo> {
    const body: JsonObject = { decision, message: options.message ?? "" };
    if (options.arguments !== undefined) body["arguments"] = options.arguments;
    return this.request("POST", approvalPath(approvalId, "decide/"), body);
  }

  // -- push channel ------------------------------------------------------------------------

  /** The websocket address where the server pushes stops and approval decisions for a run. */
  pushUrl(runId: string): string {
    const url = new URL(this.baseUrl);
    url.protocol = url.protocol === "https:" ? "wss:" : "ws:";
    url.pathname = `${url.pathname.replace(/\/+$/, "")}/ws/agent/runs/${encodeURIComponent(runId)}/`;
    url.search = "";
    return url.toString();
  }

  // -- plumbing ----------------------------------------------------------------------------

  async request<T>(method: "GET" | "POST", path: string, body?: JsonObject): Promise<T> {
    const headers = this.headers();
    if (body !== undefined) headers["Content-Type"] = "application/json";
    let response: Response;
    try {
      response = await fetch(`${this.baseUrl}${path}`, {
        method,
        headers,
        body: body === undefined ? undefined : JSON.stringify(body),
        signal: AbortSignal.timeout(this.timeoutMs),
      });
    } catch (error) {
      throw new TransportError(`${method} ${path}: ${describe(error)}`, { cause: error });
    }
    let text: string;
    try {
      text = await response.text();
    } catch (error) {
      throw new TransportError(`${method} ${path}: body lost: ${describe(error)}`, { cause: error });
    }
    const decoded = decode(text);
    if (response.ok) return decoded as T;
    throw errorFromAnswer(response.status, decoded, text);
  }
}

export function errorFromAnswer(status: number, body: unknown, text = ""): ApiError {
  let code = `http_${status}`;
  let detail = text.slice(0, 500);
  if (body !== null && typeof body === "object" && !Array.isArray(body)) {
    const fields = body as Record<string, unknown>;
    if (typeof fields["error"] === "string" && fields["error"]) code = fields["error"];
    detail = typeof fields["detail"] === "string" ? fields["detail"] : "";
  }
  if (status === 409 && REFUSAL_CODES.has(code)) return new Refused(status, code, detail, body);
  if (status === 409 && code === ToolCallConflict.CODE) {
    return new ToolCallConflict(status, code, detail, body);
  }
  if (code === ClientTooOld.CODE) return new ClientTooOld(status, code, detail, body);
  return new ApiError(status, code, detail, body);
}

/** No answer, or a 5xx/408/429: worth a retry. Refusals and other 4xx answers are decisions. */
export function isNetworkError(error: unknown): boolean {
  return error instanceof TransportError || (error instanceof ApiError && error.isTransient);
}

function decode(text: string): unknown {
  if (!text) return null;
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return null;
  }
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error ? ` (${error.cause.message})` : "";
    return `${error.message}${cause}`;
  }
  return String(error);
}

function runPath(runId: string, suffix = ""): string {
  return `/api/v1/runs/${encodeURIComponent(runId)}/${suffix}`;
}

function approvalPath(approvalId: string, suffix = ""): string {
  return `/api/v1/approvals/${encodeURIComponent(approvalId)}/${suffix}`;
}

function dropUndefined<T extends object>(fields: T): JsonObject {
  const kept: JsonObject = {};
  for (const [name, value] of Object.entries(fields)) {
    if (value !== undefined) kept[name] = value as JsonValue;
  }
  return kept;
}
