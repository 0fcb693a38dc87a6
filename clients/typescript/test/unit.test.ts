/** The client's rules without a server: outcomes, decisions, errors. */

import assert from "node:assert/strict";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import {
  ApprovalRejectedError,
  ClientTooOld,
  Refused,
  SafestopClient,
  ToolCallConflict,
  ToolCallRecord,
  TransportError,
  decisionFromApproval,
  decisionFromFrame,
  outcomeOf,
  usageFields,
  type ApprovalInfo,
} from "../src/index.js";

test("outcomes: a write that did not finish is unknown, never failed", () => {
  const call = (sideEffect: "none" | "write", started = true): ToolCallRecord => {
    const record = new ToolCallRecord("tool", {}, { sideEffect }, undefined);
    record.bodyStarted = started;
    return record;
  };
  assert.equal(outcomeOf(call("write"), false), "succeeded");
  assert.equal(outcomeOf(call("write"), true), "unknown");
  assert.equal(outcomeOf(call("none"), true), "failed");
  assert.equal(outcomeOf(call("write", false), true), "not_started");
  const known = call("write");
  known.hasResult = true;
  assert.equal(outcomeOf(known, true), "succeeded", "a known success is never overwritten");
  const declared = call("write");
  declared.declaredState = "failed";
  assert.equal(outcomeOf(declared, true), "failed", "the tool's own word wins");
});

test("decisions: the push frame and the approval's GET", () => {
  const frame = decisionFromFrame({
    type: "approval.decided",
    approval_id: "appr_1",
    tool_call_id: "call_1",
    outbox_id: null,
    decision: "approve",
    status: "approved",
    arguments: null,
    message: "",
    permit_id: "permit_3",
    epoch: 1,
  });
  assert.equal(frame?.status, "approved");
  assert.equal(frame?.arguments, undefined, "null arguments say nothing: the GET has them");
  assert.equal(frame?.permitId, "permit_3");
  assert.equal(decisionFromFrame({ type: "pong" }), undefined);
  const waiting = { id: "appr_2", status: "waiting", arguments: { a: 1 } } as unknown as ApprovalInfo;
  assert.equal(decisionFromApproval(waiting), undefined);
  const rejected = decisionFromApproval({ ...waiting, status: "rejected", message: "no" });
  assert.equal(rejected?.status, "rejected");
  assert.equal(rejected?.message, "no");
  const error = new ApprovalRejectedError("no", "rejected", { id: "appr_2" });
  assert.equal(error.approvalId, "appr_2");
  assert.equal(error.reviewerMessage, "no");
});

test("errors: refusals, a client too old, and no answer", async () => {
  const answers: Array<[number, object]> = [
    [409, { error: "stale_epoch", detail: "stopped", status: "cancel_requested", stop_epoch: 2 }],
    [426, { error: "client_too_old", detail: "upgrade", minimum_version: "9.0.0" }],
    [
      409,
      { error: "tool_call_conflict", detail: "other call", tool_call_id: "X1", first_tool: "send_email", first_arguments: { to: "a" } },
    ],
  ];
  const seen: Array<string | undefined> = [];
  const server = createServer((request, response) => {
    seen.push(request.headers["safestop-agent-version"] as string | undefined);
    const [status, body] = answers.shift() ?? [500, {}];
    response.writeHead(status, { "Content-Type": "application/json" }).end(JSON.stringify(body));
  });
  await new Promise<void>((ready) => server.listen(0, "127.0.0.1", ready));
  const port = (server.address() as AddressInfo).port;
  try {
    const client = new SafestopClient({ baseUrl: `http://127.0.0.1:${port}/`, token: "ss_x" });
    const refused = await client.getRun("run_1").catch((error: unknown) => error);
    assert.ok(refused instanceof Refused);
    assert.equal(refused.stopEpoch, 2);
    assert.equal(refused.runStatus, "cancel_requested");
    const old = await client.getRun("run_1").catch((error: unknown) => error);
    assert.ok(old instanceof ClientTooOld);
    assert.equal(old.minimumVersion, "9.0.0");
    const conflict = await client.getRun("run_1").catch((error: unknown) => error);
    assert.ok(conflict instanceof ToolCallConflict);
    assert.ok(!(conflict instanceof Refused), "a conflict is not a stop");
    assert.equal(conflict.toolCallId, "X1");
    assert.equal(conflict.firstTool, "send_email");
    assert.deepEqual(conflict.firstArguments, { to: "a" });
    assert.deepEqual(seen, ["0.2.0", "0.2.0", "0.2.0"]);
    assert.equal(client.pushUrl("run_1"), `ws://127.0.0.1:${port}/ws/agent/runs/run_1/`);
  } finally {
    server.close();
  }
  const nobody = new SafestopClient({ baseUrl: `http://127.0.0.1:${port}`, token: "ss_x", timeoutMs: 2000 });
  await assert.rejects(nobody.getRun("run_1"), TransportError);
});

test("usage: OpenTelemetry's names on the wire; bad figures throw before anything is queued", () => {
  assert.deepEqual(
    usageFields({ model: "gpt-4o", provider: "openai", inputTokens: 1200, outputTokens: 80, cacheReadTokens: 1000, costUsd: "0.0001" }),
    { model: "gpt-4o", input_tokens: 1200, output_tokens: 80, provider: "openai", cache_read_tokens: 1000, cost_usd: "0.0001" },
  );
  assert.throws(() => usageFields({ model: "", inputTokens: 1, outputTokens: 1 }), RangeError);
  assert.throws(() => usageFields({ model: "m", inputTokens: -1, outputTokens: 1 }), RangeError);
  assert.throws(() => usageFields({ model: "m", inputTokens: 1.5, outputTokens: 1 }), RangeError);
  for (const cost of [Number.NaN, Number.POSITIVE_INFINITY, -1, "NaN"]) {
    assert.throws(() => usageFields({ model: "m", inputTokens: 1, outputTokens: 1, costUsd: cost }), RangeError);
  }
});
