/**
 * The fields of a `usage` event (DESIGN §13): one model call's tokens, named as OpenTelemetry's
 * `gen_ai.usage.*` attributes name them. `AgentRun.reportUsage` queues them.
 *
 * Checked here what the server would refuse anyway, so a bad figure is an error where it was
 * made rather than a warning about a rejected event later.
 */

import type { JsonObject } from "./types.js";

/** What `run.reportUsage(...)` takes. */
export interface UsageReport {
  model: string;
  /** Every input token, cached ones included. */
  inputTokens: number;
  outputTokens: number;
  provider?: string;
  cacheReadTokens?: number;
  cacheWriteTokens?: number;
  /** Only when the provider reported what the call cost: it then wins over the price table. */
  costUsd?: number | string;
  /** Defaults to the step open where `reportUsage` is called. */
  stepKey?: string;
  /** Defaults to a fresh one; give the provider's response id (or one made from it) to count a repeat once. */
  eventId?: string;
}

function tokens(name: string, value: number | undefined): number | undefined {
  if (value === undefined) return undefined;
  if (!Number.isInteger(value) || value < 0) {
    throw new RangeError(`${name} must be a whole number of tokens, not ${String(value)}`);
  }
  return value;
}

/** The wire fields of one `usage` event (without `step_key`); throws `RangeError` on bad figures. */
export function usageFields(usage: UsageReport): JsonObject {
  if (!usage.model) throw new RangeError("usage needs a model");
  const fields: JsonObject = {
    model: usage.model,
    input_tokens: tokens("inputTokens", usage.inputTokens) as number,
    output_tokens: tokens("outputTokens", usage.outputTokens) as number,
  };
  if (usage.provider !== undefined) fields["provider"] = usage.provider;
  const cacheRead = tokens("cacheReadTokens", usage.cacheReadTokens);
  if (cacheRead !== undefined) fields["cache_read_tokens"] = cacheRead;
  const cacheWrite = tokens("cacheWriteTokens", usage.cacheWriteTokens);
  if (cacheWrite !== undefined) fields["cache_write_tokens"] = cacheWrite;
  if (usage.costUsd !== undefined) {
    const cost = Number(usage.costUsd);
    if (!Number.isFinite(cost) || cost < 0) {
      throw new RangeError(`costUsd must be a finite number of dollars, not ${String(usage.costUsd)}`);
    }
    // A string travels as its exact text (the server reads numbers and numeric strings).
    fields["cost_usd"] = usage.costUsd;
  }
  return fields;
}
