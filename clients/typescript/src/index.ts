/**
 * `@safestop/agent`: make a Node agent stoppable and reviewable with safestop.
 *
 *     const client = new SafestopClient({ baseUrl, token });
 *     const run = await client.createRun({ title: "Refund 1042", agent: "support-bot" });
 *     await client.withLease(run.id, "worker-1", async (lease) => {
 *       const order = await lease.toolCall("lookup_order", { order: "1042" },
 *         (args, call) => fetch(`${shop}/orders/${args.order}`, { signal: call.signal }).then((r) => r.json()));
 *       await lease.complete({ order });
 *     });
 *
 * The stop is `lease.signal`, a standard `AbortSignal`: hand it to anything that takes one.
 */

import { AgentRun, type LeaseOptions, type LeaseOutcome } from "./run.js";
import { WireClient } from "./wire.js";

export class SafestopClient extends WireClient {
  /** Take a lease on `runId` and start listening for stops. Call `run.finish()` when done. */
  lease(runId: string, workerId: string, options: LeaseOptions = {}): Promise<AgentRun> {
    return new AgentRun(this, runId, workerId, options).acquire();
  }

  /**
   * Lease `runId`, run `work`, then finish: `drained` after a stop, otherwise the lease is
   * released. Work ended by the run's own stop resolves `{stopped: true, stop}`; any other
   * error is rethrown (after finishing). Call `run.complete(...)` inside `work`: a worker that
   * just gives its lease back leaves the run `interrupted`, waiting for a resume.
   */
  async withLease<T>(
    runId: string,
    workerId: string,
    work: (run: AgentRun) => Promise<T>,
    options: LeaseOptions = {},
  ): Promise<LeaseOutcome<T>> {
    const run = await this.lease(runId, workerId, options);
    try {
      const value = await work(run);
      return { stopped: false, value, run };
    } catch (error) {
      const stop = run.stop;
      if (stop && run.isStop(error)) return { stopped: true, stop, run };
      throw error;
    } finally {
      await run.finish();
    }
  }
}

export { AgentRun, ToolCallRecord, outcomeOf, decisionFromApproval, decisionFromFrame } from "./run.js";
export type { ApprovalDecision, LeaseOptions, LeaseOutcome, ToolCallContext, ToolCallOptions } from "./run.js";
export { usageFields } from "./usage.js";
export type { UsageReport } from "./usage.js";
export { WireClient, errorFromAnswer, isNetworkError } from "./wire.js";
export type { CreateRunInput, OutboxItem, OutboxRequest, PermitRequest, WireClientOptions } from "./wire.js";
export {
  ApiError,
  ApprovalRejectedError,
  ClientTooOld,
  NoPermitError,
  REFUSAL_CODES,
  Refused,
  RunStoppedError,
  ToolCallConflict,
  TransportError,
} from "./errors.js";
export type { Logger } from "./signals.js";
export { sleep } from "./util.js";
export { VERSION } from "./version.js";
export type * from "./types.js";
