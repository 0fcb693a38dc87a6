/**
 * A Node agent that a reviewer can stop and approve from the safestop console.
 *
 *     cd clients/typescript && npm ci && npx tsc -p .
 *     SAFESTOP_URL=http://127.0.0.1:8000 SAFESTOP_TOKEN=<agent token> node dist/examples/agent.js
 *
 * It looks an order up, then refunds it; the refund waits for a reviewer (Approvals page):
 * approve it (or edit the amount) and it goes on with the final arguments; reject it and the
 * reply says why. Press Stop while it works: `run.signal` aborts, the timer and the fetch in
 * flight end at once, nothing new starts, and the worker reports `drained`.
 *
 * In your own project: `import { SafestopClient } from "@safestop/agent";`
 */

import { hostname } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";

import { ApprovalRejectedError, SafestopClient } from "../src/index.js";

interface Order {
  order: string;
  paid: number;
  delivered: boolean;
}

async function main(): Promise<number> {
  const baseUrl = process.env["SAFESTOP_URL"];
  const token = process.env["SAFESTOP_TOKEN"];
  if (!baseUrl || !token) {
    console.error("set SAFESTOP_URL and SAFESTOP_TOKEN (an agent token)");
    return 2;
  }
  const client = new SafestopClient({ baseUrl, token });
  const runId =
    process.argv[2] ??
    (
      await client.createRun({
        title: "Refund order 1042",
        agent: "ts-example",
        steps: [
          { key: "investigate", name: "Look at the order", kind: "tool_read" },
          { key: "settle", name: "Refund it", kind: "tool_write" },
        ],
      })
    ).id;
  console.log(`run ${runId}: open it in the console; approve the refund on the Approvals page`);

  const outcome = await client.withLease(runId, `${hostname()}-${process.pid}`, async (run) => {
    const order = await run.step("investigate", "Look at the order", async () => {
      const found = await run.toolCall("lookup_order", { order: "1042" }, async (args, call) => {
        // Stands in for a slow API call: anything that takes `call.signal` stops with the run.
        await sleep(500, undefined, { signal: call.signal });
        const result: Order = { order: args.order, paid: 120, delivered: false };
        return result;
      });
      run.checkpoint("investigated", { order: found.order, paid: found.paid });
      return found;
    });

    const reply = await run.step(
      "settle",
      "Refund it",
      async () => {
        try {
          const receipt = await run.toolCall(
            "refund",
            { order: order.order, amount: order.paid },
            async (args, call) => {
              // The payment provider; a stop here is reported `unknown`, never `failed`.
              await sleep(300, undefined, { signal: call.signal });
              return `refund-${args.order}-${args.amount}`;
            },
            {
              sideEffect: "write",
              needsApproval: true,
              risk: "high",
              recoveryPolicy: "query_original",
              summary: `Refund ${order.paid} EUR on order ${order.order}`,
              argumentsSchema: {
                type: "object",
                properties: { order: { type: "string" }, amount: { type: "integer", minimum: 0 } },
                required: ["order", "amount"],
              },
            },
          );
          return `Refunded (${receipt}).`;
        } catch (error) {
          if (error instanceof ApprovalRejectedError) {
            return `No refund: ${error.reviewerMessage || error.status}`;
          }
          throw error;
        }
      },
      { kind: "tool_write" },
    );
    await run.complete({ reply });
    return reply;
  });

  if (outcome.stopped) {
    console.log(`stopped (${outcome.stop.reason} by ${outcome.stop.requestedBy ?? "the server"}); drained`);
  } else {
    console.log(`completed: ${outcome.value}`);
  }
  return 0;
}

main().then(
  (code) => process.exit(code),
  (error: unknown) => {
    console.error(error);
    process.exit(1);
  },
);
