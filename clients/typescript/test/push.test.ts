/** The push socket takes no for an answer (docs/api.md, "Push socket"): 4401 and 4404 are not
 * retried (each retry with a wrong token would spend the address's budget, and a spent budget
 * closes every handshake from the address, other workers' too); 4429 waits the window out; any
 * other close is retried with the usual backoff. A real `ws` server closes each handshake with
 * the code under test and counts them. */

import assert from "node:assert/strict";
import type { AddressInfo } from "node:net";
import { test } from "node:test";

import { WebSocketServer } from "ws";

import { PushListener, quietLogger } from "../src/signals.js";

interface ClosingServer {
  port: number;
  handshakes: () => number;
  close: () => Promise<void>;
}

async function closingServer(code: number): Promise<ClosingServer> {
  const server = new WebSocketServer({ host: "127.0.0.1", port: 0 });
  await new Promise<void>((resolve) => server.once("listening", () => resolve()));
  let handshakes = 0;
  server.on("connection", (socket) => {
    handshakes += 1;
    socket.close(code, "refused");
  });
  return {
    port: (server.address() as AddressInfo).port,
    handshakes: () => handshakes,
    close: () => new Promise<void>((resolve) => server.close(() => resolve())),
  };
}

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

async function handshakesWithin(code: number, ms: number, throttledWaitMs?: number): Promise<number> {
  const server = await closingServer(code);
  const listener = new PushListener({
    url: `ws://127.0.0.1:${server.port}/ws/agent/runs/run_1/`,
    headers: { Authorization: "Bearer ss_wrong" },
    onSignal: () => true,
    onFrame: () => undefined,
    logger: quietLogger,
    minBackoffMs: 20,
    maxBackoffMs: 50,
    ...(throttledWaitMs === undefined ? {} : { throttledWaitMs }),
  });
  listener.start();
  try {
    await sleep(ms);
    return server.handshakes();
  } finally {
    await listener.stop();
    await server.close();
  }
}

test("push: a refused token or run is not retried", async () => {
  // With a 20-50 ms backoff, 800 ms would hold a dozen handshakes.
  assert.equal(await handshakesWithin(4401, 800), 1);
  assert.equal(await handshakesWithin(4404, 800), 1);
});

test("push: a throttled address waits the window out", async () => {
  assert.equal(await handshakesWithin(4429, 800, 30_000), 1);
});

test("push: any other close is retried with the usual backoff", async () => {
  assert.ok((await handshakesWithin(1011, 800)) >= 3);
});
