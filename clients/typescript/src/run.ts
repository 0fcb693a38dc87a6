/**
 * One leased run, as the worker sees it (DESIGN §9): the lease, its heartbeat and push
 * listener, the stop as a standard `AbortSignal`, tool calls with permit-before /
 * result-after, approvals, batched events, and the drain.
 *
 * The rules it keeps (the same as the Python `safestop_agent`):
 * - No tool starts without a permit asked at this lease's epoch, and never without a
 *   `permit_id`; a refused permit aborts `run.signal` and the body never runs.
 * - A call that needs approval waits for the reviewer's decision (push frame, with the
 *   approval's GET polled as a fallback), still aborted by a stop; it runs with the final
 *   (possibly edited) arguments, or throws `ApprovalRejectedError` with the reviewer's message.
 * - Every permitted call reports an outcome. A write whose body did not finish is reported
 *   `unknown`, never `failed`: it may have happened. A call whose body never began is
 *   `not_started`.
 * - Facts (results, completed steps) are retried and sent even after a stop; new work
 *   (permits, step starts) is not. Finishing after a stop reports `drained`; otherwise the
 *   lease is released.
 */

import { AsyncLocalStorage } from "node:async_hooks";
import { randomUUID } from "node:crypto";

import {
  ApiError,
  ApprovalRejectedError,
  NoPermitError,
  REFUSAL_CODES,
  Refused,
  RunStoppedError,
  ToolCallConflict,
} from "./errors.js";
import { HeartbeatLoop, PushListener, quietLogger, type Logger } from "./signals.js";
import type {
  ApprovalDecidedFrame,
  ApprovalInfo,
  ApprovalStatus,
  EventAnswer,
  ExecutionState,
  JsonObject,
  JsonValue,
  PermitAnswer,
  RecoveryPolicy,
  RemoteCancelState,
  Risk,
  RunInfo,
  SideEffect,
  StepKind,
  StopSignal,
  WireEvent,
} from "./types.js";
import { usageFields, type UsageReport } from "./usage.js";
import { retry, shortText } from "./util.js";
import { isNetworkError, type OutboxItem, type WireClient } from "./wire.js";

// Facts are worth a few quick retries: the server accepts them even after a stop, and every
// one carries a client id (event_id, tool_call_id), so a repeat is harmless.
const FACT_ATTEMPTS = 4;
const FACT_BASE_DELAY_MS = 200;
// A stop voids the approvals that wait, and its signal may reach us just after the void: wait
// this long for it, so a stop surfaces as the stop rather than as a rejection.
const VOID_GRACE_MS = 1000;
const MAX_BATCH = 500;

export interface LeaseOptions {
  /** Lease time to live, seconds (1–3600, default 30). */
  ttlSeconds?: number;
  /** Default: a third of the TTL. */
  heartbeatIntervalMs?: number;
  /** Listen on the agent websocket for stops and approval decisions (default true). */
  push?: boolean;
  /** How often a waiting approval's GET is polled in case a push was missed (default 3000). */
  approvalPollIntervalMs?: number;
  /** Queued events are sent once this many wait (default 100, at most 500)... */
  eventBatchSize?: number;
  /** ...or this long after the first of them was queued (default 250 ms). */
  eventFlushIntervalMs?: number;
  logger?: Logger;
}

export interface ToolCallOptions {
  /** `write` for anything with an effect outside (default `none`). */
  sideEffect?: SideEffect;
  /** The model's id for the call; default a fresh `call_<uuid>`. */
  toolCallId?: string;
  idempotencyKey?: string;
  operationId?: string;
  recoveryPolicy?: RecoveryPolicy;
  /** Default: the step this call runs inside (`run.step(...)`), if any. */
  stepKey?: string;
  /** Ask a reviewer before it runs (a team rule may ask anyway). */
  needsApproval?: boolean;
  /** What the reviewer reads. */
  summary?: string;
  risk?: Risk;
  /** JSON Schema a reviewer's edited arguments must satisfy. */
  argumentsSchema?: JsonObject;
}

/** The end of one approval's wait. `arguments` is undefined when the source did not carry them. */
export interface ApprovalDecision {
  approvalId: string;
  status: Exclude<ApprovalStatus, "waiting">;
  message: string;
  arguments: JsonValue | undefined;
  permitId: string | undefined;
  toolCallId: string | undefined;
  source: JsonObject;
}

/** What a tool body sees: the final arguments, the run's signal, and ways to record facts. */
export interface ToolCallContext<A> {
  readonly toolCallId: string;
  readonly tool: string;
  /** The arguments the body must use: the reviewer's when edited. */
  readonly arguments: A;
  /** The arguments the agent asked with. */
  readonly originalArguments: A;
  readonly argumentsEdited: boolean;
  /** `run.signal`: pass it to fetch, timers, child processes. */
  readonly signal: AbortSignal;
  readonly permitId: string;
  readonly approval: JsonObject | undefined;
  /** The remote system's id for this operation: what a human queries to verify it. */
  setOperationId(operationId: string): void;
  /** Record what was seen so far; the last observation goes into the report. */
  observe(text: string, options?: { truncated?: boolean }): void;
  /** Record the outcome as soon as it is known, so a later error cannot turn it into `unknown`. */
  setResult(result: unknown): void;
  setRemoteCancelState(state: RemoteCancelState): void;
  /** Say how the call ended when the tool itself knows (e.g. the remote said "failed"). */
  setExecutionState(state: ExecutionState): void;
}

/** What the worker knows about one tool call it asked a permit for. */
export class ToolCallRecord {
  readonly tool: string;
  readonly toolCallId: string;
  readonly sideEffect: SideEffect;
  readonly originalArguments: unknown;
  arguments: unknown;
  readonly options: ToolCallOptions;
  permit: PermitAnswer | undefined;
  approval: JsonObject | undefined;
  decision: ApprovalDecision | undefined;
  operationId: string | undefined;
  observations: string[] = [];
  outputTruncated = false;
  remoteCancelState: RemoteCancelState | undefined;
  declaredState: ExecutionState | undefined;
  /** The state reported (or to report) for this call. */
  executionState: ExecutionState | undefined;
  /** True once the server has the outcome. */
  reported = false;
  /** The server's answer to the outcome report. */
  reportAnswer: JsonObject | undefined;
  hasResult = false;
  result: unknown;
  bodyStarted = false;

  constructor(tool: string, args: unknown, options: ToolCallOptions, stepKey: string | undefined) {
    this.tool = tool;
    this.arguments = args;
    this.originalArguments = args;
    this.options = { ...options, stepKey: options.stepKey ?? stepKey };
    this.sideEffect = options.sideEffect ?? "none";
    this.toolCallId = options.toolCallId ?? `call_${randomUUID().replaceAll("-", "")}`;
    this.operationId = options.operationId;
  }

  get argumentsEdited(): boolean {
    return this.approval !== undefined && JSON.stringify(this.arguments) !== JSON.stringify(this.originalArguments);
  }

  get lastObservation(): string | undefined {
    return this.observations[this.observations.length - 1];
  }

  /** The call as a drain observation: only facts the server has not received carry a state. */
  drainObservation(): JsonObject {
    const observation: JsonObject = {
      kind: "tool_call",
      tool_call_id: this.toolCallId,
      tool: this.tool,
      side_effect: this.sideEffect,
      reported: this.reported,
    };
    if (!this.reported) {
      observation["execution_state"] = this.executionState ?? "running";
      observation["observation"] = this.lastObservation ?? "";
      observation["output_truncated"] = this.outputTruncated;
      if (this.operationId) observation["operation_id"] = this.operationId;
      if (this.remoteCancelState) observation["remote_cancel_state"] = this.remoteCancelState;
    }
    return observation;
  }
}

/**
 * Which state to report for a call whose body ended with `error` (undefined: it returned).
 * A declared state wins; a recorded result is never overwritten; a write that did not finish
 * may have happened (`unknown`, never `failed`); a read that did not finish `failed`.
 */
export function outcomeOf(call: ToolCallRecord, failed: boolean): ExecutionState {
  if (call.declaredState !== undefined) return call.declaredState;
  if (!call.bodyStarted) return "not_started";
  if (!failed || call.hasResult) return "succeeded";
  return call.sideEffect === "write" ? "unknown" : "failed";
}

interface QueuedEvent {
  event: WireEvent;
  settle?: (answer: EventAnswer) => void;
}

/** The outcome of `client.withLease(...)`: the work's value, or the stop that ended it. */
export type LeaseOutcome<T> =
  | { stopped: false; value: T; run: AgentRun }
  | { stopped: true; stop: RunStoppedError; run: AgentRun };

export class AgentRun {
  readonly client: WireClient;
  readonly runId: string;
  readonly workerId: string;
  readonly ttlSeconds: number;
  /** Aborts the moment the run is stopped (push, heartbeat, or a refusal); `reason` is a `RunStoppedError`. */
  readonly signal: AbortSignal;
  leaseId: string | undefined;
  epoch: number | undefined;
  /** Every tool call asked under this lease (permitted or not). */
  readonly toolCalls: ToolCallRecord[] = [];
  completed = false;
  drainedSent = false;
  /** When the stop reached this worker (`Date.now()`), and how. */
  stoppedAt: number | undefined;

  private readonly controller = new AbortController();
  private readonly options: Required<Omit<LeaseOptions, "logger" | "heartbeatIntervalMs">> & {
    heartbeatIntervalMs: number;
  };
  private readonly logger: Logger;
  private heartbeat: HeartbeatLoop | undefined;
  private listener: PushListener | undefined;
  private readonly decisions = new Map<string, ApprovalDecision>();
  private readonly decisionWaiters = new Set<() => void>();
  private readonly steps = new AsyncLocalStorage<string>();
  private queue: QueuedEvent[] = [];
  private flushing: Promise<void> = Promise.resolve();
  private flushTimer: NodeJS.Timeout | undefined;
  private finishing: Promise<void> | undefined;
  /** True once `release({suspend: true})` suspended the run to wait for reviewers. */
  suspended = false;

  constructor(client: WireClient, runId: string, workerId: string, options: LeaseOptions = {}) {
    this.client = client;
    this.runId = runId;
    this.workerId = workerId;
    this.ttlSeconds = options.ttlSeconds ?? 30;
    this.signal = this.controller.signal;
    this.logger = options.logger ?? quietLogger;
    this.options = {
      ttlSeconds: this.ttlSeconds,
      heartbeatIntervalMs: options.heartbeatIntervalMs ?? (this.ttlSeconds * 1000) / 3,
      push: options.push ?? true,
      approvalPollIntervalMs: options.approvalPollIntervalMs ?? 3000,
      eventBatchSize: Math.min(MAX_BATCH, Math.max(1, options.eventBatchSize ?? 100)),
      eventFlushIntervalMs: options.eventFlushIntervalMs ?? 250,
    };
  }

  // -- lease lifecycle -----------------------------------------------------------------

  /** Take the lease and start listening for stops (push and heartbeat). */
  async acquire(): Promise<this> {
    const lease = await this.client.acquireLease(this.runId, this.workerId, this.ttlSeconds);
    this.leaseId = lease.lease_id;
    this.epoch = lease.epoch;
    this.listen(lease.lease_id, lease.epoch);
    return this;
  }

  private listen(leaseId: string, epoch: number): void {
    this.heartbeat = new HeartbeatLoop({
      beat: () => this.client.heartbeat(this.runId, leaseId, epoch),
      intervalMs: this.options.heartbeatIntervalMs,
      ttlMs: this.ttlSeconds * 1000,
      onSignal: (signal) => void this.handleStopSignal(signal, "heartbeat"),
      onLeaseLost: (code, stopEpoch) =>
        this.abort(new RunStoppedError({ reason: code, via: "heartbeat", stopEpoch })),
      logger: this.logger,
    });
    this.heartbeat.start();
    if (this.options.push) {
      this.listener = new PushListener({
        url: this.client.pushUrl(this.runId),
        headers: this.client.headers(),
        onSignal: (signal) => this.handleStopSignal(signal, "push"),
        onFrame: (frame) => this.handlePushFrame(frame),
        logger: this.logger,
      });
      this.listener.start();
    }
  }

  /**
   * Give the lease back now (queued events are sent first); `finish()` then has nothing left.
   * With `{suspend: true}` the run is suspended to wait for reviewers instead of being
   * interrupted: its waiting approvals stay open, a reviewer decides them while no process
   * holds the run, and the next lease (any process) goes on at the same epoch and gets the
   * decisions when it asks the same permits again (same `toolCallId`). The server refuses it
   * (`Refused`, `illegal_transition`) while a tool call is in flight; the lease is then still
   * held. If a stop came first, the release counts as the drain and the stop is thrown.
   */
  async release(options: { suspend?: boolean; reason?: string } = {}): Promise<JsonObject> {
    const { leaseId, epoch } = this.requireLease();
    this.throwIfStopped();
    await this.flush();
    // Quiet first: a heartbeat after the release would take the revoked lease for a stop.
    this.heartbeat?.stop();
    await this.listener?.stop();
    let answer: JsonObject;
    try {
      answer = await this.client.releaseLease(this.runId, leaseId, epoch, {
        suspend: options.suspend ?? false,
        reason: options.reason ?? "waiting_for_approval",
      });
    } catch (error) {
      if (error instanceof Refused && error.code !== "illegal_transition") throw this.refused(error);
      this.listen(leaseId, epoch); // not released: the lease is still ours
      throw error;
    }
    this.leaseId = undefined;
    const status = answer["status"];
    if (options.suspend && typeof status === "string" && status !== "suspended") {
      this.drainedSent = true; // a stop came first: the server took the release as the drain
      this.abort(new RunStoppedError({ reason: status, via: "refusal" }));
      this.throwIfStopped();
    }
    this.suspended = options.suspend ?? false;
    return answer;
  }

  /** Resolves once the push socket is open (rejects after `timeoutMs`; at once without push). */
  async whenPushConnected(timeoutMs = 10_000): Promise<void> {
    if (!this.listener) return;
    let timer: NodeJS.Timeout | undefined;
    const timeout = new Promise<never>((_, reject) => {
      timer = setTimeout(() => reject(new Error(`push socket not open after ${timeoutMs} ms`)), timeoutMs);
    });
    try {
      await Promise.race([this.listener.whenConnected(), timeout]);
    } finally {
      clearTimeout(timer);
    }
  }

  /** True once the run was stopped. */
  get stopped(): boolean {
    return this.signal.aborted;
  }

  /** The stop that aborted `run.signal`, if any. */
  get stop(): RunStoppedError | undefined {
    return this.signal.aborted ? (this.signal.reason as RunStoppedError) : undefined;
  }

  /** Throw the stop (a `RunStoppedError`) if the run was stopped: check it at every safe boundary. */
  throwIfStopped(): void {
    if (this.signal.aborted) throw this.signal.reason;
  }

  /**
   * True when `error` is this run's stop: the `RunStoppedError` itself, or an `AbortError`
   * that `run.signal` caused (`timers/promises`, `child_process`, `events.once` wrap it as `cause`).
   */
  isStop(error: unknown): boolean {
    if (!this.signal.aborted) return false;
    if (error === this.signal.reason || error instanceof RunStoppedError) return true;
    return error instanceof Error && error.name === "AbortError" && error.cause === this.signal.reason;
  }

  /** A pushed or heartbeat stop signal; true if it belongs to this lease's round. */
  handleStopSignal(signal: StopSignal, via: "push" | "heartbeat"): boolean {
    if (typeof signal.stop_epoch === "number" && this.epoch !== undefined && signal.stop_epoch <= this.epoch) {
      this.logger.info(`safestop: ignoring stop signal for old epoch ${signal.stop_epoch}`);
      return false;
    }
    this.abort(
      new RunStoppedError({
        reason: signal.reason || "cancel_requested",
        via,
        stopEpoch: signal.stop_epoch,
        requestedBy: signal.requested_by,
        stopRequestId: signal.stop_request_id,
        requestedAt: signal.requested_at,
        signal,
      }),
    );
    return true;
  }

  private abort(stop: RunStoppedError): void {
    if (this.controller.signal.aborted) return;
    this.stoppedAt = Date.now();
    this.controller.abort(stop);
  }

  /** Learn of the stop from a refusal: abort the signal and return the stop to throw. */
  private refused(error: Refused): RunStoppedError {
    this.abort(new RunStoppedError({ reason: error.code, via: "refusal", stopEpoch: error.stopEpoch }));
    return this.signal.reason as RunStoppedError;
  }

  private requireLease(): { leaseId: string; epoch: number } {
    if (this.leaseId === undefined || this.epoch === undefined) {
      throw new Error("the run has no lease: use client.lease(...) or client.withLease(...)");
    }
    return { leaseId: this.leaseId, epoch: this.epoch };
  }

  /**
   * Send queued events, then say `drained` if the run was stopped, else release the lease;
   * stop listening. Safe to call twice. Never throws: the server's drain deadline and lease
   * expiry settle a worker that could not say goodbye.
   */
  finish(): Promise<void> {
    this.finishing ??= this.finishOnce();
    return this.finishing;
  }

  private async finishOnce(): Promise<void> {
    // After a stop, `drained` goes before the listeners stop: closing the push socket waits
    // for the server's closing handshake, time the run's `stopped_cleanly` would wait for.
    // A release stops listening first, so no stop signal arrives for a lease given back.
    if (!this.signal.aborted) await this.stopListening();
    try {
      await this.flush();
      if (this.leaseId === undefined || this.epoch === undefined) return;
      if (this.signal.aborted) {
        if (!this.drainedSent) await this.drained();
      } else {
        await this.client.releaseLease(this.runId, this.leaseId, this.epoch);
      }
    } catch (error) {
      if (error instanceof Refused) {
        this.logger.info(`safestop: lease on ${this.runId} already gone (${error.code})`);
      } else {
        this.logger.warn(`safestop: could not finish lease on ${this.runId}: ${String(error)}`);
      }
    } finally {
      await this.stopListening();
    }
  }

  private async stopListening(): Promise<void> {
    this.heartbeat?.stop();
    await this.listener?.stop();
  }

  /** Tell the server this worker has stopped all work for the run (sent by `finish()` after a stop). */
  async drained(observations?: JsonObject[]): Promise<RunInfo> {
    const { leaseId, epoch } = this.requireLease();
    const stop = this.stop;
    const answer = await retry(
      () =>
        this.client.drained(
          this.runId,
          leaseId,
          epoch,
          observations ?? this.defaultObservations(),
          stop?.stopEpoch,
        ),
      { attempts: FACT_ATTEMPTS, baseDelayMs: FACT_BASE_DELAY_MS, retryIf: isNetworkError },
    );
    this.drainedSent = true;
    return answer;
  }

  /** What the worker knows at drain time: the stop it saw and every call it made under this lease. */
  defaultObservations(): JsonObject[] {
    const stop = this.stop;
    return [
      { kind: "stop_seen", reason: stop?.reason ?? null, stop_epoch: stop?.stopEpoch ?? null },
      ...this.toolCalls.filter((call) => call.permit !== undefined).map((call) => call.drainObservation()),
    ];
  }

  // -- tool calls ----------------------------------------------------------------------

  /**
   * Guard one tool call: a permit before, the outcome after.
   *
   * Throws before `body` runs when the run is stopped (`RunStoppedError`), when a reviewer
   * rejects it (`ApprovalRejectedError`, with the reviewer's message) or when the server
   * answers without a permit (`NoPermitError`). Otherwise `body` runs with the final
   * arguments (a reviewer's edits included) and its value is returned; its error is rethrown
   * after the outcome was reported.
   */
  async toolCall<A, R>(
    tool: string,
    args: A,
    body: (args: A, call: ToolCallContext<A>) => R | Promise<R>,
    options: ToolCallOptions = {},
  ): Promise<R> {
    this.requireLease();
    // A call still queued when the stop arrived never starts, and never even asks.
    this.throwIfStopped();
    const call = new ToolCallRecord(tool, args, options, this.steps.getStore());
    this.toolCalls.push(call);
    await this.askPermit(call);
    const context = this.contextFor<A>(call);
    let result: R;
    try {
      // The last moment a stop can keep the body from running.
      this.throwIfStopped();
      call.bodyStarted = true;
      result = await body(call.arguments as A, context);
    } catch (error) {
      await this.reportOutcome(call, error, true);
      throw error;
    }
    if (!call.hasResult) {
      call.hasResult = true;
      call.result = result;
    }
    await this.reportOutcome(call, undefined, false);
    return result;
  }

  private contextFor<A>(call: ToolCallRecord): ToolCallContext<A> {
    return {
      toolCallId: call.toolCallId,
      tool: call.tool,
      arguments: call.arguments as A,
      originalArguments: call.originalArguments as A,
      argumentsEdited: call.argumentsEdited,
      signal: this.signal,
      permitId: call.permit?.permit_id ?? "",
      approval: call.approval,
      setOperationId: (operationId) => {
        call.operationId = operationId;
      },
      observe: (text, observeOptions) => {
        call.observations.push(text);
        call.outputTruncated ||= observeOptions?.truncated ?? false;
      },
      setResult: (value) => {
        call.hasResult = true;
        call.result = value;
      },
      setRemoteCancelState: (state) => {
        call.remoteCancelState = state;
      },
      setExecutionState: (state) => {
        call.declaredState = state;
      },
    };
  }

  /** Ask the permit at this lease's epoch; wait for an approval if the answer says so. */
  private async askPermit(call: ToolCallRecord): Promise<void> {
    const { epoch } = this.requireLease();
    let answer: PermitAnswer;
    try {
      answer = await retry(
        () =>
          this.client.requestPermit(this.runId, {
            epoch,
            tool_call_id: call.toolCallId,
            tool: call.tool,
            side_effect: call.sideEffect,
            arguments: call.arguments as JsonValue,
            idempotency_key: call.options.idempotencyKey,
            operation_id: call.operationId,
            recovery_policy: call.options.recoveryPolicy,
            step_key: call.options.stepKey,
            needs_approval: call.options.needsApproval ? true : undefined,
            summary: call.options.summary,
            risk: call.options.risk,
            arguments_schema: call.options.argumentsSchema,
          }),
        { attempts: 3, baseDelayMs: FACT_BASE_DELAY_MS, signal: this.signal, retryIf: isNetworkError },
      );
      if (!answer.permit_id) {
        answer = await this.waitForPermit(call, answer);
      } else if (answer.approval && answer.arguments !== undefined) {
        // A permit asked again after its approval carries the approved arguments.
        call.approval = answer.approval as unknown as JsonObject;
        call.arguments = answer.arguments;
      }
    } catch (error) {
      if (error instanceof Refused) throw this.refused(error);
      if (error instanceof ApprovalRejectedError) throw error; // the server settled the call
      // The id is another call's: a "not_started" report would land on that call's record.
      if (error instanceof ToolCallConflict) throw error;
      if (error instanceof ApiError) {
        const closed = closedApproval(error);
        if (closed) throw closed;
      }
      // No answer, a stop during the backoff or the approval wait, or no permit id: the
      // permit may exist server-side, but the call certainly never started.
      await this.reportNotStarted(call);
      throw error;
    }
    call.permit = answer;
  }

  private async waitForPermit(call: ToolCallRecord, answer: PermitAnswer): Promise<PermitAnswer> {
    const approval = answer.approval;
    if (!approval || typeof approval.id !== "string" || !approval.id) throw new NoPermitError(answer);
    call.approval = approval as unknown as JsonObject;
    const decision = await this.waitForApproval(approval.id, {
      pollNow: approval.status !== undefined && approval.status !== "waiting",
    });
    call.decision = decision;
    call.approval = { ...call.approval, ...decision.source, status: decision.status };
    if (decision.status === "void") {
      // A void is the stop's doing more often than not: let the stop win if it is on its way.
      await this.waitForStop(VOID_GRACE_MS);
      this.throwIfStopped();
    }
    if (decision.status !== "approved") {
      throw new ApprovalRejectedError(decision.message, decision.status, call.approval);
    }
    let permitId = decision.permitId;
    let args = decision.arguments;
    if (!permitId || args === undefined) {
      // The decision did not carry everything: the approval itself does.
      const current = await this.fetchApproval(approval.id);
      permitId ??= current.permit_id ?? undefined;
      if (args === undefined) args = current.arguments;
    }
    if (!permitId) throw new NoPermitError(call.approval);
    if (args !== undefined) call.arguments = args;
    return { permit_id: permitId, tool_call_id: call.toolCallId, epoch: answer.epoch, approval: call.approval as unknown as ApprovalInfo };
  }

  private waitForStop(ms: number): Promise<void> {
    if (this.signal.aborted) return Promise.resolve();
    return new Promise((resolve) => {
      const done = (): void => {
        clearTimeout(timer);
        this.signal.removeEventListener("abort", done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      this.signal.addEventListener("abort", done, { once: true });
    });
  }

  private async fetchApproval(approvalId: string): Promise<ApprovalInfo> {
    try {
      return await retry(() => this.client.getApproval(approvalId), {
        attempts: 3,
        baseDelayMs: FACT_BASE_DELAY_MS,
        signal: this.signal,
        retryIf: isNetworkError,
      });
    } catch (error) {
      if (error instanceof Refused) throw this.refused(error);
      throw error;
    }
  }

  /**
   * Wait until approval `approvalId` is decided; resolve with the decision (never rejects for
   * a rejection: look at `status` and `message`). The decision comes from the push socket at
   * once, or from the approval's GET polled every `approvalPollIntervalMs`. A stop rejects
   * with the stop (the server voids the approval). Tool calls wait by themselves.
   */
  waitForApproval(approvalId: string, options: { pollNow?: boolean; timeoutMs?: number } = {}): Promise<ApprovalDecision> {
    return new Promise<ApprovalDecision>((resolve, reject) => {
      let settled = false;
      let pollTimer: NodeJS.Timeout | undefined;
      let timeoutTimer: NodeJS.Timeout | undefined;
      const cleanup = (): void => {
        settled = true;
        clearTimeout(pollTimer);
        clearTimeout(timeoutTimer);
        this.signal.removeEventListener("abort", onAbort);
        this.decisionWaiters.delete(check);
      };
      const onAbort = (): void => {
        cleanup();
        reject(this.signal.reason);
      };
      const check = (): void => {
        const decision = this.decisions.get(approvalId);
        if (decision && !settled) {
          cleanup();
          resolve(decision);
        }
      };
      const poll = async (): Promise<void> => {
        try {
          const decision = decisionFromApproval(await this.client.getApproval(approvalId));
          if (decision) this.postDecision(decision);
        } catch (error) {
          if (error instanceof Refused) {
            this.refused(error); // aborts: onAbort rejects
          } else if (isNetworkError(error)) {
            this.logger.info(`safestop: approval ${approvalId} not polled: ${String(error)}`);
          } else if (!settled) {
            cleanup();
            reject(error);
          }
        }
        if (!settled) pollTimer = setTimeout(() => void poll(), this.options.approvalPollIntervalMs);
      };
      if (this.signal.aborted) {
        onAbort();
        return;
      }
      this.signal.addEventListener("abort", onAbort, { once: true });
      this.decisionWaiters.add(check);
      check();
      if (settled) return;
      pollTimer = setTimeout(() => void poll(), options.pollNow ? 0 : this.options.approvalPollIntervalMs);
      if (options.timeoutMs !== undefined) {
        timeoutTimer = setTimeout(() => {
          cleanup();
          reject(new Error(`approval ${approvalId} still waiting after ${options.timeoutMs} ms`));
        }, options.timeoutMs);
      }
    });
  }

  /** A pushed frame that is not a stop: an approval's decision is posted for its waiter. */
  handlePushFrame(frame: JsonObject): void {
    const decision = decisionFromFrame(frame);
    if (decision) this.postDecision(decision);
  }

  private postDecision(decision: ApprovalDecision): void {
    // A decision is taken once: the first one heard is kept.
    if (!this.decisions.has(decision.approvalId)) this.decisions.set(decision.approvalId, decision);
    for (const wake of [...this.decisionWaiters]) wake();
  }

  private async reportNotStarted(call: ToolCallRecord): Promise<void> {
    call.executionState = "not_started";
    try {
      call.reportAnswer = await this.client.reportToolResult(this.runId, call.toolCallId, {
        execution_state: "not_started",
      });
      call.reported = true;
    } catch {
      this.logger.info(`safestop: no permit record for ${call.toolCallId} to mark not_started`);
    }
  }

  /** Report the call's execution state; retried, and sent even after a stop. Never throws. */
  private async reportOutcome(call: ToolCallRecord, error: unknown, failed: boolean): Promise<void> {
    const state = outcomeOf(call, failed);
    let observation = call.lastObservation;
    if (failed && !call.hasResult) {
      const note = this.describeError(error);
      observation = observation ? `${observation}\n[${note}]` : note;
    } else if (observation === undefined && call.hasResult) {
      observation = shortText(call.result);
    }
    call.executionState = state;
    try {
      call.reportAnswer = await retry(
        () =>
          this.client.reportToolResult(this.runId, call.toolCallId, {
            execution_state: state,
            operation_id: call.operationId,
            observation,
            output_truncated: call.outputTruncated,
            remote_cancel_state: call.remoteCancelState,
          }),
        { attempts: FACT_ATTEMPTS, baseDelayMs: FACT_BASE_DELAY_MS, retryIf: isNetworkError },
      );
      call.reported = true;
    } catch (reportError) {
      // Not thrown: the tool's own outcome matters more. The drain lists it as unreported.
      this.logger.warn(`safestop: result of ${call.toolCallId} not reported: ${String(reportError)}`);
    }
  }

  private describeError(error: unknown): string {
    if (this.isStop(error)) return `interrupted by stop (${this.stop?.reason ?? "stop"})`;
    if (error instanceof Error) return `${error.name}: ${error.message}`;
    return String(error);
  }

  // -- outbox --------------------------------------------------------------------------

  /**
   * Hand a side effect to the server to dispatch; refused after a stop (throws the stop). An
   * item a reviewer must approve first answers `status: "awaiting_approval"` with its
   * `approval`: the server dispatches it once approved and never otherwise
   * (`run.waitForApproval(item.approval.id)` to know before going on).
   */
  async enqueueOutbox(
    transport: "webhook" | "email",
    destination: string,
    payload: JsonValue,
    options: { idempotencyKey?: string; toolCallId?: string; needsApproval?: boolean; summary?: string; risk?: Risk } = {},
  ): Promise<OutboxItem> {
    const { epoch } = this.requireLease();
    this.throwIfStopped();
    const key = options.idempotencyKey ?? `outbox_${randomUUID().replaceAll("-", "")}`;
    try {
      return await retry(
        () =>
          this.client.enqueueOutbox(this.runId, {
            epoch,
            transport,
            destination,
            payload,
            idempotency_key: key,
            tool_call_id: options.toolCallId,
            needs_approval: options.needsApproval ? true : undefined,
            summary: options.summary,
            risk: options.risk,
          }),
        { attempts: 3, baseDelayMs: FACT_BASE_DELAY_MS, signal: this.signal, retryIf: isNetworkError },
      );
    } catch (error) {
      if (error instanceof Refused) throw this.refused(error);
      throw error;
    }
  }

  // -- steps and events ----------------------------------------------------------------

  /**
   * Run `body` as a step: `step.started` is sent first (with everything queued before it) and
   * refused after a stop, and then `body` never runs; `step.completed` or `step.failed` is
   * queued after, to go with the next batch. Tool calls inside the step name it.
   */
  async step<R>(key: string, name: string, body: () => R | Promise<R>, options: { kind?: StepKind } = {}): Promise<R> {
    this.throwIfStopped();
    const started = await this.sendEvent("step.started", { key, name, kind: options.kind ?? "tool_read" });
    if (started.status === "rejected") {
      if (started.code && REFUSAL_CODES.has(started.code)) {
        throw this.refused(new Refused(409, started.code, started.detail ?? "step.started rejected", started));
      }
      this.logger.warn(`safestop: step.started ${key} rejected: ${started.code ?? ""} ${started.detail ?? ""}`);
    }
    let result: R;
    try {
      result = await this.steps.run(key, body);
    } catch (error) {
      this.event("step.failed", { key, error: this.describeError(error), cancelled: this.isStop(error) });
      throw error;
    }
    this.event("step.completed", { key });
    return result;
  }

  /** Queue one event (a fact); it is sent with the next batch. Returns its `event_id`. */
  event(type: string, fields: JsonObject = {}, eventId?: string): string {
    const event: WireEvent = { ...fields, event_id: eventId ?? `evt_${randomUUID().replaceAll("-", "")}`, type };
    this.queue.push({ event });
    if (this.queue.length >= this.options.eventBatchSize) void this.flush();
    else this.flushTimer ??= setTimeout(() => void this.flush(), this.options.eventFlushIntervalMs);
    return event.event_id;
  }

  /** Send one event now (with everything queued before it, in one batch) and return its answer. */
  async sendEvent(type: string, fields: JsonObject = {}): Promise<EventAnswer> {
    this.requireLease();
    const event: WireEvent = { ...fields, event_id: `evt_${randomUUID().replaceAll("-", "")}`, type };
    let answer: EventAnswer = { event_id: event.event_id, status: "unsent" };
    this.queue.push({ event, settle: (given) => (answer = given) });
    await this.flush();
    return answer;
  }

  /** Send every queued event, in batches of up to `eventBatchSize`, in order. */
  flush(): Promise<void> {
    clearTimeout(this.flushTimer);
    this.flushTimer = undefined;
    // The chain never rejects: one failed batch must not stop the ones after it.
    this.flushing = this.flushing
      .then(() => this.sendQueued())
      .catch((error: unknown) => this.logger.warn(`safestop: events not sent on ${this.runId}: ${String(error)}`));
    return this.flushing;
  }

  private async sendQueued(): Promise<void> {
    while (this.queue.length > 0) {
      if (this.epoch === undefined) return;
      const batch = this.queue.splice(0, this.options.eventBatchSize);
      const epoch = this.epoch;
      let answers: EventAnswer[];
      try {
        const answer = await retry(
          () => this.client.sendEvents(this.runId, epoch, batch.map((item) => item.event)),
          { attempts: FACT_ATTEMPTS, baseDelayMs: FACT_BASE_DELAY_MS, retryIf: isNetworkError },
        );
        answers = answer.results ?? [];
      } catch (error) {
        if (error instanceof Refused) this.refused(error);
        const code = error instanceof ApiError ? error.code : "unsent";
        this.logger.warn(`safestop: ${batch.length} event(s) not accepted on ${this.runId}: ${String(error)}`);
        answers = batch.map((item) => ({
          event_id: item.event.event_id,
          status: error instanceof ApiError ? "rejected" : "unsent",
          code,
          detail: String(error),
        }));
      }
      const byId = new Map(answers.map((answer) => [answer.event_id, answer]));
      for (const item of batch) {
        const answer = byId.get(item.event.event_id) ?? { event_id: item.event.event_id, status: "unsent" as const };
        if (answer.status === "rejected" && !item.settle) {
          this.logger.warn(`safestop: event ${item.event.type} rejected: ${answer.code ?? ""} ${answer.detail ?? ""}`);
        }
        item.settle?.(answer);
      }
    }
  }

  /** Save a resume point; the stop packet names the latest as `resume_from`. Queued. */
  checkpoint(label: string, state: JsonObject = {}, stepSeq?: number): string {
    const fields: JsonObject = { label, state };
    if (stepSeq !== undefined) fields["step_seq"] = stepSeq;
    return this.event("checkpoint.saved", fields);
  }

  /** Record something the run produced, for a human taking over. Queued. */
  artifact(name: string, fields: { kind?: string; uri?: string; content?: string; checksum?: string; reusable?: boolean; evidence?: boolean; stepKey?: string } = {}): string {
    const event: JsonObject = { name, kind: fields.kind ?? "", reusable: fields.reusable ?? false, evidence: fields.evidence ?? false };
    if (fields.uri !== undefined) event["uri"] = fields.uri;
    if (fields.content !== undefined) event["content"] = fields.content;
    if (fields.checksum !== undefined) event["checksum"] = fields.checksum;
    const stepKey = fields.stepKey ?? this.steps.getStore();
    if (stepKey !== undefined) event["step_key"] = stepKey;
    return this.event("artifact.added", event);
  }

  /**
   * Report one model call's tokens as a `usage` event (DESIGN §13; OpenTelemetry's
   * `gen_ai.usage.*` names). Queued and batched like every fact; returns its `event_id`.
   * `inputTokens` counts every input token, cached ones included; give `costUsd` only when the
   * provider said what the call cost (it then wins over the server's price table). `stepKey`
   * defaults to the step open here; `eventId` (e.g. from the provider's response id) makes a
   * repeated report of the same call a `duplicate`, counted once. Bad figures throw
   * `RangeError` before anything is queued: the server would refuse the event.
   */
  reportUsage(usage: UsageReport): string {
    const fields = usageFields(usage);
    const stepKey = usage.stepKey ?? this.steps.getStore();
    if (stepKey !== undefined) fields["step_key"] = stepKey;
    return this.event("usage", fields, usage.eventId);
  }

  /** Report the run finished. After a stop the server keeps it as a late fact only. */
  async complete(result: JsonValue = null): Promise<EventAnswer> {
    const answer = await this.sendEvent("run.completed", { result });
    this.completed = answer.status === "accepted" || answer.status === "duplicate";
    return answer;
  }

  fail(error: string): Promise<EventAnswer> {
    return this.sendEvent("run.failed", { error });
  }

  suspend(reason: string): Promise<EventAnswer> {
    return this.sendEvent("run.suspended", { reason });
  }
}

/** A 409 `approval_closed` (a permit asked again once its approval ended) as the rejection. */
function closedApproval(error: ApiError): ApprovalRejectedError | undefined {
  if (error.status !== 409 || error.code !== "approval_closed") return undefined;
  const body = error.body;
  const raw = body !== null && typeof body === "object" && !Array.isArray(body) ? (body as JsonObject)["approval"] : undefined;
  const approval: JsonObject = raw !== null && typeof raw === "object" && !Array.isArray(raw) && raw !== undefined ? raw : {};
  const status = decidedStatus(approval["status"]) ?? "rejected";
  const message = typeof approval["message"] === "string" ? approval["message"] : "";
  return new ApprovalRejectedError(message, status === "approved" ? "rejected" : status, approval);
}

const STATUS_OF_DECISION: Record<string, Exclude<ApprovalStatus, "waiting">> = {
  approve: "approved",
  reject: "rejected",
  expire: "expired",
  void: "void",
};

function decidedStatus(value: unknown): Exclude<ApprovalStatus, "waiting"> | undefined {
  return value === "approved" || value === "rejected" || value === "expired" || value === "void" ? value : undefined;
}

function text(value: unknown): string | undefined {
  return typeof value === "string" && value !== "" ? value : undefined;
}

/** `{"type": "approval.decided", ...}` → a decision. */
export function decisionFromFrame(frame: JsonObject): ApprovalDecision | undefined {
  if (frame["type"] !== "approval.decided") return undefined;
  const decided = frame as unknown as ApprovalDecidedFrame;
  const status = STATUS_OF_DECISION[String(decided.decision)];
  if (!status || !text(decided.approval_id)) return undefined;
  return {
    approvalId: decided.approval_id,
    status,
    message: text(decided.message) ?? "",
    // A frame's `arguments: null` says nothing: the approval's GET has the final ones.
    arguments: decided.arguments === null ? undefined : decided.arguments,
    permitId: text(decided.permit_id),
    toolCallId: text(decided.tool_call_id),
    source: frame,
  };
}

/** A decided approval (`GET /api/v1/approvals/{id}/`) → a decision; undefined while it waits. */
export function decisionFromApproval(approval: ApprovalInfo): ApprovalDecision | undefined {
  const status = decidedStatus(approval.status);
  if (!status || !text(approval.id)) return undefined;
  return {
    approvalId: approval.id,
    status,
    message: text(approval.message) ?? "",
    arguments: approval.arguments,
    permitId: text(approval.permit_id),
    toolCallId: text(approval.tool_call_id),
    source: approval as unknown as JsonObject,
  };
}
