/**
 * `@safestop/agent` against a live server: the three things that matter —
 * 1. a stop reaches the running work within the push latency (run.signal aborts: fetch, timers
 *    and child processes with it) and nothing new starts after it;
 * 2. a write in flight at the stop is reported `unknown`, never `failed`;
 * 3. a waiting approval decided by a reviewer resumes the work with the final arguments, and a
 *    rejection throws `ApprovalRejectedError` carrying the reviewer's message —
 * plus events batching, `not_started`, and the runnable example. Stops and decisions go
 * through the server's HTTP API with a reviewer token, so they reach the worker by push.
 */

import assert from "node:assert/strict";
import { execFile, spawn } from "node:child_process";
import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { after, before, describe, test } from "node:test";
import { setTimeout as delay } from "node:timers/promises";
import { fileURLToPath } from "node:url";

import {
  AgentRun,
  ApprovalRejectedError,
  RunStoppedError,
  SafestopClient,
  ToolCallConflict,
  type ApprovalInfo,
  type JsonObject,
  type JsonValue,
} from "../src/index.js";
import { startServer, waitFor, type LiveServer } from "./support/server.js";

// From the reviewer's cancel POST to the worker's signal aborting, the POST included.
const PUSH_LATENCY_MS = 1000;
// Approvals must reach the worker by push: the fallback poll is made too slow to matter.
const SLOW_POLL = { approvalPollIntervalMs: 60_000 };

let live: LiveServer;
let agent: SafestopClient;
let reviewer: SafestopClient;
let hanging: Server;
let hangingUrl: string;

before(async () => {
  live = await startServer();
  agent = new SafestopClient({ baseUrl: live.baseUrl, token: live.agentToken });
  reviewer = new SafestopClient({ baseUrl: live.baseUrl, token: live.reviewerToken });
  // An upstream that never answers: only the stop can end a fetch to it.
  hanging = createServer(() => undefined);
  await new Promise<void>((ready) => hanging.listen(0, "127.0.0.1", ready));
  hangingUrl = `http://127.0.0.1:${(hanging.address() as AddressInfo).port}/slow`;
});

after(async () => {
  hanging?.closeAllConnections();
  await new Promise<void>((closed) => (hanging ? hanging.close(() => closed()) : closed()));
  await live?.stop();
});

async function newRun(title: string): Promise<string> {
  const run = await agent.createRun({
    title,
    agent: "ts-bot",
    steps: [{ key: "work", name: "Work", kind: "tool_write" }],
  });
  return run.id;
}

async function leased(runId: string, options = {}): Promise<AgentRun> {
  const run = await agent.lease(runId, "ts-worker", { ttlSeconds: 30, ...options });
  await run.whenPushConnected();
  return run;
}

async function runStatus(runId: string, wanted: string): Promise<string> {
  return waitFor(async () => {
    const run = await reviewer.getRun(runId);
    return run.status === wanted ? run.status : undefined;
  }, `run ${runId} to be ${wanted}`);
}

async function waitingApproval(runId: string): Promise<ApprovalInfo> {
  const listed = await waitFor(async () => {
    const waiting = await reviewer.listApprovals({ status: "waiting", run: runId });
    return waiting.length === 1 ? waiting[0] : undefined;
  }, `an approval waiting on ${runId}`);
  // A list item carries a summary of the arguments; the detail has them whole.
  return reviewer.getApproval(listed.id);
}

/** What a promise settled with (its value, or the error it rejected with), handled at once. */
function settled(promise: Promise<unknown>): Promise<unknown> {
  return promise.then(
    (value) => value,
    (error: unknown) => error,
  );
}

function toolCallsIn(packet: JsonObject): JsonObject[] {
  const calls = packet["tool_calls"];
  return Array.isArray(calls) ? (calls as JsonObject[]) : [];
}

describe("a stop", () => {
  test("reaches the running work within the push latency; nothing new starts after it", async () => {
    const runId = await newRun("TS stop");
    const run = await leased(runId);
    let abortedAt = 0;
    run.signal.addEventListener("abort", () => (abortedAt = performance.now()));
    let fetchStarted = false;
    let childStarted = false;

    const reading = run.step("work", "Work", async () => {
      const fetching = run.toolCall("fetch_upstream", { url: hangingUrl }, async (args, call) => {
        fetchStarted = true;
        const answer = await fetch(args.url, { signal: call.signal });
        return answer.status;
      });
      const sleeping = run.toolCall("shell", { argv: ["sleep", "30"] }, (args, call) =>
        new Promise<string>((done, fail) => {
          childStarted = true;
          execFile("sleep", ["30"], { signal: call.signal }, (error) => (error ? fail(error) : done("slept")));
        }),
      );
      const timer = run.toolCall("wait", { seconds: 30 }, async (_args, call) => {
        await delay(30_000, undefined, { signal: call.signal });
        return "waited";
      });
      return Promise.allSettled([fetching, sleeping, timer]);
    });

    await waitFor(async () => (fetchStarted && childStarted ? true : undefined), "the tools to start");
    await delay(100);
    const sent = performance.now();
    await reviewer.cancel(runId, "user_stop", "stop from the TS test");
    const settled = await reading;
    const latency = abortedAt - sent;
    assert.ok(abortedAt > 0, "run.signal aborted");
    assert.ok(latency < PUSH_LATENCY_MS, `stop reached the worker in ${latency.toFixed(1)} ms`);
    assert.equal(run.stop?.via, "push");
    assert.equal(run.stop?.reason, "user_stop");
    assert.ok(run.signal.reason instanceof RunStoppedError);
    assert.equal((run.signal.reason as RunStoppedError).stopEpoch, 2);
    // fetch rejects with the stop itself; timers and child processes with an AbortError caused by it.
    for (const outcome of settled) {
      assert.equal(outcome.status, "rejected");
      assert.ok(run.isStop(outcome.reason), `a stop, not ${String(outcome.reason)}`);
    }

    // Nothing new starts after the stop: not a tool call, not a step.
    let ranAfterStop = false;
    await assert.rejects(
      run.toolCall("late", {}, () => {
        ranAfterStop = true;
      }),
      RunStoppedError,
    );
    await assert.rejects(run.step("later", "Later", () => (ranAfterStop = true)), RunStoppedError);
    assert.equal(ranAfterStop, false);

    // `drained` goes out while the push socket is still open: closing it first would make the
    // run's stopped_cleanly wait for the server's closing handshake.
    const internals = run as unknown as {
      client: { drained: (...args: unknown[]) => Promise<unknown> };
      listener?: { connected: boolean };
    };
    const sendDrained = internals.client.drained;
    let listeningWhenDrained: boolean | undefined;
    internals.client.drained = (...args: unknown[]) => {
      listeningWhenDrained = internals.listener?.connected;
      return sendDrained.apply(internals.client, args);
    };
    try {
      await run.finish();
    } finally {
      internals.client.drained = sendDrained;
    }
    assert.equal(listeningWhenDrained, true);
    assert.equal(internals.listener?.connected, false, "the listener stops after the drained");
    await runStatus(runId, "stopped_cleanly");
    const packet = await reviewer.stopPacket(runId);
    assert.ok(packet["acknowledged_at"], "the stop was acknowledged");
    assert.ok(packet["drained_at"], "the worker said drained");
    const states = Object.fromEntries(toolCallsIn(packet).map((c) => [c["tool"], c["execution_state"]]));
    assert.deepEqual(states, { fetch_upstream: "failed", shell: "failed", wait: "failed" });
  });

  test("a write in flight is reported unknown, never failed; so is a write that threw", async () => {
    const runId = await newRun("TS write in flight");
    let outcome: Awaited<ReturnType<SafestopClient["withLease"]>> | undefined;
    let writing = false;
    const working = agent.withLease(
      runId,
      "ts-worker",
      async (run) => {
        await run.whenPushConnected();
        // A write that threw after it started may have happened too: unknown.
        await assert.rejects(
          run.toolCall("charge", { amount: 5 }, () => {
            throw new Error("gateway timeout");
          }, { sideEffect: "write", idempotencyKey: "charge-5" }),
          /gateway timeout/,
        );
        assert.equal(run.toolCalls.at(-1)?.executionState, "unknown");
        // A read that threw simply failed.
        await assert.rejects(run.toolCall("read", {}, () => Promise.reject(new Error("404"))), /404/);
        assert.equal(run.toolCalls.at(-1)?.executionState, "failed");
        return run.step("work", "Work", () =>
          run.toolCall(
            "deploy",
            { service: "api", version: "1.2.3" },
            async (_args, call) => {
              call.setOperationId("deploy-77");
              writing = true;
              await delay(30_000, undefined, { signal: call.signal });
              return "deployed";
            },
            { sideEffect: "write", recoveryPolicy: "query_original" },
          ),
        );
      },
      { ttlSeconds: 30 },
    ).then((result) => (outcome = result));
    await waitFor(async () => (writing ? true : undefined), "the write to start");
    await reviewer.cancel(runId, "user_stop", "stop mid-write");
    await working;
    assert.equal(outcome?.stopped, true);
    const run = outcome?.run;
    const deploy = run?.toolCalls.find((call) => call.tool === "deploy");
    assert.equal(deploy?.executionState, "unknown");
    assert.equal(deploy?.reported, true);

    await runStatus(runId, "stopped_dirty");
    const packet = await reviewer.stopPacket(runId);
    const states = Object.fromEntries(toolCallsIn(packet).map((c) => [c["tool"], c["execution_state"]]));
    assert.deepEqual(states, { charge: "unknown", read: "failed", deploy: "unknown" });
    const unconfirmed = (packet["unconfirmed_side_effects"] as JsonObject[]).map((c) => c["tool"]).sort();
    assert.deepEqual(unconfirmed, ["charge", "deploy"]);
    const deployed = toolCallsIn(packet).find((c) => c["tool"] === "deploy");
    assert.equal(deployed?.["operation_id"], "deploy-77");
  });

  test("without the push socket the heartbeat still stops the work", async () => {
    const runId = await newRun("TS heartbeat stop");
    const run = await agent.lease(runId, "ts-worker", { push: false, heartbeatIntervalMs: 200 });
    const waiting = settled(
      run.toolCall("wait", {}, async (_args, call) => delay(30_000, undefined, { signal: call.signal })),
    );
    await delay(100);
    await reviewer.cancel(runId, "user_stop", "heartbeat only");
    assert.ok(run.isStop(await waiting));
    assert.equal(run.stop?.via, "heartbeat");
    assert.equal(run.stop?.reason, "user_stop");
    await run.finish();
    await runStatus(runId, "stopped_cleanly");
  });

  test("a stop while a call waits for approval: the stop, not a rejection; the body never runs", async () => {
    const runId = await newRun("TS stop while waiting");
    const run = await leased(runId, SLOW_POLL);
    let ran = false;
    const call = settled(
      run.toolCall("pay", { amount: 10 }, () => (ran = true), {
        sideEffect: "write",
        needsApproval: true,
        summary: "pay 10",
        risk: "high",
      }),
    );
    const approval = await waitingApproval(runId);
    const sent = performance.now();
    await reviewer.cancel(runId, "user_stop", "not now");
    assert.ok((await call) instanceof RunStoppedError);
    assert.ok((run.stoppedAt ?? 0) > 0);
    assert.ok(performance.now() - sent < 1000 + PUSH_LATENCY_MS);
    assert.equal(ran, false);
    assert.equal(run.toolCalls[0]?.executionState, "not_started");
    await run.finish();
    const voided = await reviewer.getApproval(approval.id);
    assert.equal(voided.status, "void");
    await runStatus(runId, "stopped_cleanly");
    const states = toolCallsIn(await reviewer.stopPacket(runId)).map((c) => c["execution_state"]);
    assert.deepEqual(states, ["not_started"]);
  });
});

describe("approvals", () => {
  test("approved with edited arguments: the work resumes by push with the final arguments", async () => {
    const runId = await newRun("TS approval");
    const run = await leased(runId, SLOW_POLL);
    let seen: { order: string; amount: number } | undefined;
    let edited = false;
    let resumedAt = 0;
    const refund = run.toolCall(
      "refund",
      { order: "1042", amount: 120 },
      (args, call) => {
        resumedAt = performance.now();
        seen = args;
        edited = call.argumentsEdited;
        assert.deepEqual(call.originalArguments, { order: "1042", amount: 120 });
        return `refund-${args.order}-${args.amount}`;
      },
      {
        sideEffect: "write",
        needsApproval: true,
        summary: "Refund 120 EUR on order 1042",
        risk: "high",
        argumentsSchema: {
          type: "object",
          properties: { order: { type: "string" }, amount: { type: "integer", maximum: 100 } },
          required: ["order", "amount"],
        },
      },
    );
    const approval = await waitingApproval(runId);
    assert.equal(approval.tool, "refund");
    assert.equal(approval.risk, "high");
    assert.deepEqual(approval.original_arguments, { order: "1042", amount: 120 });
    assert.equal(seen, undefined, "the body waits for the reviewer");
    const sent = performance.now();
    await reviewer.decideApproval(approval.id, "approve", {
      message: "capped at 80",
      arguments: { order: "1042", amount: 80 },
    });
    assert.equal(await refund, "refund-1042-80");
    assert.deepEqual(seen, { order: "1042", amount: 80 });
    assert.equal(edited, true);
    assert.ok(resumedAt - sent < PUSH_LATENCY_MS, `resumed ${(resumedAt - sent).toFixed(1)} ms after the decision`);
    const record = run.toolCalls[0];
    assert.equal(record?.executionState, "succeeded");
    assert.equal(record?.reportAnswer?.["execution_state"], "succeeded");
    await run.complete({ refund: "refund-1042-80" });
    await run.finish();
    await runStatus(runId, "completed");
    const decided = await reviewer.getApproval(approval.id);
    assert.equal(decided.status, "approved");
    assert.ok(decided.permit_id);
  });

  test("a rejection throws ApprovalRejectedError with the reviewer's message; the run goes on", async () => {
    const runId = await newRun("TS rejection");
    const run = await leased(runId, SLOW_POLL);
    let ran = false;
    const call = settled(
      run.toolCall("delete_account", { user: "u-7" }, () => (ran = true), {
        sideEffect: "write",
        needsApproval: true,
        summary: "delete u-7",
        risk: "high",
      }),
    );
    const approval = await waitingApproval(runId);
    await reviewer.decideApproval(approval.id, "reject", { message: "never delete accounts" });
    const error = await call;
    assert.ok(error instanceof ApprovalRejectedError);
    assert.equal(error.reviewerMessage, "never delete accounts");
    assert.equal(error.status, "rejected");
    assert.equal(error.approvalId, approval.id);
    assert.equal(ran, false);
    assert.equal(run.stopped, false, "a rejection is not a stop");
    // The run goes on: a read still gets its permit, and the run completes.
    assert.equal(await run.toolCall("lookup", { user: "u-7" }, () => "found"), "found");
    assert.equal((await run.complete({ answer: "not deleted" })).status, "accepted");
    await run.finish();
    await runStatus(runId, "completed");
  });

  test("without the push socket the approval's GET is the fallback", async () => {
    const runId = await newRun("TS approval by polling");
    const run = await agent.lease(runId, "ts-worker", { push: false, approvalPollIntervalMs: 200 });
    const call = settled(
      run.toolCall("send_invoice", { to: "a@example.com" }, (args) => `sent to ${args.to}`, {
        sideEffect: "write",
        needsApproval: true,
        summary: "send the invoice",
        risk: "low",
      }),
    );
    const approval = await waitingApproval(runId);
    await reviewer.decideApproval(approval.id, "approve", { arguments: { to: "billing@example.com" } });
    assert.equal(await call, "sent to billing@example.com");
    assert.equal(run.toolCalls[0]?.executionState, "succeeded");
    await run.complete(null);
    await run.finish();
    await runStatus(runId, "completed");
  });

  test("an outbox item held for a reviewer: waitForApproval hears the decision by push", async () => {
    const runId = await newRun("TS outbox approval");
    const run = await leased(runId, SLOW_POLL);
    const item = await run.enqueueOutbox("webhook", "http://127.0.0.1:9/hook", { text: "hello" }, {
      needsApproval: true,
      summary: "tell the customer",
      risk: "medium",
    });
    assert.equal(item.status, "awaiting_approval");
    const approvalId = item.approval?.id ?? "";
    const decided = run.waitForApproval(approvalId);
    await reviewer.decideApproval(approvalId, "reject", { message: "wrong customer" });
    const decision = await decided;
    assert.equal(decision.status, "rejected");
    assert.equal(decision.message, "wrong customer");
    await reviewer.cancel(runId, "user_stop", "done here");
    await waitFor(async () => (run.stopped ? true : undefined), "the stop");
    await assert.rejects(run.enqueueOutbox("webhook", "http://127.0.0.1:9/hook", {}), RunStoppedError);
    await run.finish();
    await runStatus(runId, "stopped_cleanly");
  });
});

describe("tool call ids", () => {
  test("one id asked for another call: ToolCallConflict, the body never runs, the first call keeps its outcome", async () => {
    const runId = await newRun("TS id reused");
    const run = await leased(runId);
    const sent = await run.toolCall("send_email", { to: "a" }, () => "sent", {
      sideEffect: "write",
      toolCallId: "X1",
    });
    assert.equal(sent, "sent");
    let ran = false;
    const conflict = await settled(
      run.toolCall("lookup", { q: "x" }, () => (ran = true), { toolCallId: "X1" }),
    );
    assert.ok(conflict instanceof ToolCallConflict, String(conflict));
    assert.equal(conflict.firstTool, "send_email");
    assert.deepEqual(conflict.firstArguments, { to: "a" });
    assert.equal(ran, false);
    await reviewer.cancel(runId, "user_stop", "look at the calls");
    await settled(run.toolCall("after", {}, () => undefined));
    await run.finish();
    await runStatus(runId, "stopped_cleanly");
    const calls = toolCallsIn(await reviewer.stopPacket(runId));
    // The refused ask reported nothing onto X1: the email is still known to have been sent.
    assert.deepEqual(
      calls.map((c) => [c["tool_call_id"], c["tool"], c["execution_state"]]),
      [["X1", "send_email", "succeeded"]],
    );
  });
});

describe("events", () => {
  test("facts are batched: steps, checkpoints and artifacts go in a few requests", async () => {
    const runId = await newRun("TS events");
    const run = await leased(runId, { eventFlushIntervalMs: 10_000 });
    const sizes: number[] = [];
    const send = run.client.sendEvents.bind(run.client);
    run.client.sendEvents = (id, epoch, events) => {
      sizes.push(events.length);
      return send(id, epoch, events);
    };
    try {
      for (let n = 1; n <= 3; n += 1) {
        await run.step(`s${n}`, `Step ${n}`, async () => {
          run.checkpoint(`checkpoint_${n}`, { n });
          run.artifact(`note-${n}`, { kind: "text", content: `note ${n}` });
        });
      }
      assert.equal((await run.complete({ steps: 3 })).status, "accepted");
      await run.finish();
    } finally {
      run.client.sendEvents = send;
    }
    // One request per step start (carrying what was queued before it) and one for the end.
    assert.deepEqual(sizes, [1, 4, 4, 4]);
    await runStatus(runId, "completed");
  });
});

describe("usage", () => {
  test("reportUsage is batched with the other facts, counted once per eventId, and priced on the run", async () => {
    const runId = await newRun("TS usage");
    const run = await leased(runId, { eventFlushIntervalMs: 10_000 });
    const sizes: number[] = [];
    const send = run.client.sendEvents.bind(run.client);
    run.client.sendEvents = (id, epoch, events) => {
      sizes.push(events.length);
      return send(id, epoch, events);
    };
    try {
      await run.step("plan", "Plan", async () => {
        run.reportUsage({ model: "gpt-4o", provider: "openai", inputTokens: 1200, outputTokens: 80, cacheReadTokens: 1000, eventId: "evt_usage_resp_1" });
        run.reportUsage({ model: "gpt-4o", provider: "openai", inputTokens: 1200, outputTokens: 80, cacheReadTokens: 1000, eventId: "evt_usage_resp_1" });
        run.reportUsage({ model: "my-own-model", inputTokens: 10, outputTokens: 5 });
      });
      assert.equal((await run.complete({ done: true })).status, "accepted");
      await run.finish();
    } finally {
      run.client.sendEvents = send;
    }
    assert.deepEqual(sizes, [1, 5], "the usage events went out with the step's end, in one batch");
    const info = await reviewer.getRun(runId);
    assert.deepEqual(info["tokens"], { input: 1210, output: 85, total: 1295 }, "the repeat counted once");
    assert.equal(info["unpriced_tokens"], 15, "a model the table lacks is unpriced, not $0");
    assert.ok(Number(info["cost_usd"]) > 0, `priced from the table: ${String(info["cost_usd"])}`);
  });
});

describe("suspend", () => {
  test("release({suspend: true}) keeps the approval open; the next lease gets the decision at the same epoch", async () => {
    const runId = await newRun("TS suspend for a reviewer");
    const first = await leased(runId, SLOW_POLL);
    const epoch = first.epoch as number;
    const asked = await first.client.requestPermit(runId, {
      epoch, tool_call_id: "call_refund", tool: "refund", side_effect: "write",
      arguments: { order: "1042", amount: 120 }, needs_approval: true,
    });
    assert.equal(asked.permit_id, undefined, "held for a reviewer");
    const answer = await first.release({ suspend: true });
    assert.equal(answer["status"], "suspended");
    await first.finish(); // nothing left to do: no drain, no second release
    const approval = await waitingApproval(runId);
    await reviewer.decideApproval(approval.id, "approve", { arguments: { order: "1042", amount: 90 } });
    assert.equal((await reviewer.getRun(runId)).status, "suspended", "deciding starts nothing");

    const second = await agent.lease(runId, "ts-worker-2", { ttlSeconds: 30, ...SLOW_POLL });
    assert.equal(second.epoch, epoch, "the same epoch the decision belongs to");
    const ran: JsonValue[] = [];
    try {
      const receipt = await second.toolCall("refund", { order: "1042", amount: 120 },
        async (args) => { ran.push(args as JsonValue); return "refunded"; },
        { sideEffect: "write", needsApproval: true, toolCallId: "call_refund" });
      assert.equal(receipt, "refunded");
      await second.complete({ done: true });
    } finally {
      await second.finish();
    }
    assert.deepEqual(ran, [{ order: "1042", amount: 90 }], "ran once, with the reviewer's edit");
    await runStatus(runId, "completed");
  });
});

describe("the example", () => {
  test("examples/agent.ts runs, waits for a reviewer, and completes with the edited refund", async () => {
    const here = dirname(fileURLToPath(import.meta.url));
    const script = join(here, "..", "examples", "agent.js");
    const child = spawn(process.execPath, [script], {
      env: { ...process.env, SAFESTOP_URL: live.baseUrl, SAFESTOP_TOKEN: live.agentToken },
      stdio: ["ignore", "pipe", "pipe"],
    });
    let output = "";
    child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString()));
    const exited = new Promise<number | null>((done) => child.once("exit", (code) => done(code)));
    try {
      const runId = await waitFor(async () => /run_[0-9a-f]+/.exec(output)?.[0], "the example's run id");
      const approval = await waitingApproval(runId);
      assert.equal(approval.tool, "refund");
      const original = approval.original_arguments as JsonObject;
      await reviewer.decideApproval(approval.id, "approve", { arguments: { ...original, amount: 80 } });
      const code = await Promise.race([exited, delay(30_000, "timeout", { ref: false })]);
      assert.equal(code, 0, output);
      assert.match(output, /completed/);
      assert.match(output, /80/);
      await runStatus(runId, "completed");
    } finally {
      if (child.exitCode === null) child.kill("SIGKILL");
    }
  });
});
