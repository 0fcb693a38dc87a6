/**
 * The two ways a stop reaches a worker (DESIGN §9): the websocket push (fast, milliseconds)
 * and the lease heartbeat (always works, and notices a lost lease). Both hand what they learn
 * to callbacks; the run turns a stop into `run.signal` aborting.
 */

import WebSocket from "ws";

import { ApiError } from "./errors.js";
import type { HeartbeatAnswer, JsonObject, StopSignal } from "./types.js";

export interface Logger {
  info(message: string): void;
  warn(message: string): void;
}

export const quietLogger: Logger = {
  info: () => undefined,
  warn: (message) => console.warn(message),
};

/** Renews the lease every `intervalMs`; a 404/409/410, or a whole TTL without renewal, is a lost lease. */
export class HeartbeatLoop {
  private timer: NodeJS.Timeout | undefined;
  private stopped = false;
  private lastRenewed = Date.now();

  constructor(
    private readonly options: {
      beat: () => Promise<HeartbeatAnswer>;
      intervalMs: number;
      ttlMs: number;
      onSignal: (signal: StopSignal) => void;
      onLeaseLost: (code: string, stopEpoch: number | undefined) => void;
      logger: Logger;
    },
  ) {}

  start(): void {
    this.lastRenewed = Date.now();
    this.schedule();
  }

  stop(): void {
    this.stopped = true;
    if (this.timer) clearTimeout(this.timer);
  }

  private schedule(): void {
    if (this.stopped) return;
    this.timer = setTimeout(() => {
      void this.beatOnce().then((goOn) => {
        if (goOn) this.schedule();
      });
    }, this.options.intervalMs);
  }

  /** One renewal; false once the lease is lost and beating further is pointless. */
  async beatOnce(): Promise<boolean> {
    try {
      const answer = await this.options.beat();
      this.lastRenewed = Date.now();
      if (answer && answer.signal) this.options.onSignal(answer.signal);
      return true;
    } catch (error) {
      if (error instanceof ApiError && [404, 409, 410].includes(error.status)) {
        this.options.onLeaseLost(error.code, error.stopEpoch);
        return false;
      }
      this.options.logger.warn(`safestop heartbeat failed: ${String(error)}`);
    }
    if (Date.now() - this.lastRenewed > this.options.ttlMs) {
      this.options.onLeaseLost("lease_expired", undefined);
      return false;
    }
    return true;
  }
}

/** The stop signal in a pushed frame: the frame itself, or its `signal` member. */
export function stopSignalOf(frame: JsonObject): StopSignal | undefined {
  if (frame["type"] === "cancel_requested") return frame as unknown as StopSignal;
  const inner = frame["signal"];
  if (inner && typeof inner === "object" && !Array.isArray(inner) && inner["type"] === "cancel_requested") {
    return inner as unknown as StopSignal;
  }
  return undefined;
}

/** Close codes of the push socket (docs/api.md): a refusal that reconnecting cannot change
 * (and each retry with a wrong token spends the address's budget, after which the server
 * refuses every handshake from the address, other workers' too), and a throttled address. */
const CLOSE_REFUSED = new Set([4401, 4404]);
const CLOSE_THROTTLED = 4429;
/** 4429 asks the address to wait for the rest of the server's one-minute window. */
export const THROTTLED_WAIT_MS = 60_000;

/**
 * Keeps a websocket open to the run's push channel (`/ws/agent/runs/{id}/`, bearer token in
 * the handshake, no Origin), reconnecting with backoff until `stop()`; the heartbeat covers
 * the gaps (not after a refusal, 4401 or 4404; after 4429, not before `throttledWaitMs`).
 * A pushed stop is acknowledged on the socket at once (`{"type": "ack"}`), which
 * moves the run to `draining` without waiting for the next heartbeat.
 */
export class PushListener {
  private socket: WebSocket | undefined;
  private stopped = false;
  private backoffMs: number;
  private retryTimer: NodeJS.Timeout | undefined;
  private connectedWaiters: Array<() => void> = [];
  connected = false;

  constructor(
    private readonly options: {
      url: string;
      headers: Record<string, string>;
      /** True when the signal applied (a stop of this lease's round): only then is it acked. */
      onSignal: (signal: StopSignal) => boolean;
      onFrame: (frame: JsonObject) => void;
      logger: Logger;
      minBackoffMs?: number;
      maxBackoffMs?: number;
      throttledWaitMs?: number;
    },
  ) {
    this.backoffMs = options.minBackoffMs ?? 200;
  }

  start(): void {
    this.connect();
  }

  /** Resolves once the socket is open (at once if it is). */
  whenConnected(): Promise<void> {
    if (this.connected) return Promise.resolve();
    return new Promise((resolve) => this.connectedWaiters.push(resolve));
  }

  stop(): Promise<void> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    const socket = this.socket;
    if (!socket || socket.readyState === WebSocket.CLOSED) return Promise.resolve();
    return new Promise((resolve) => {
      const done = setTimeout(() => {
        socket.terminate();
        resolve();
      }, 1000);
      socket.once("close", () => {
        clearTimeout(done);
        resolve();
      });
      if (socket.readyState === WebSocket.CONNECTING) socket.terminate();
      else socket.close(1000);
    });
  }

  private connect(): void {
    if (this.stopped) return;
    const openedAt = Date.now();
    const { headers } = this.options;
    let socket: WebSocket;
    try {
      socket = new WebSocket(this.options.url, { headers, handshakeTimeout: 10_000 });
    } catch (error) {
      // A malformed address cannot get better by retrying; the heartbeat still works.
      this.options.logger.warn(`safestop push disabled: ${String(error)}; relying on heartbeats`);
      return;
    }
    this.socket = socket;
    let refusedFor: number | undefined;
    socket.on("open", () => {
      this.connected = true;
      for (const resolve of this.connectedWaiters.splice(0)) resolve();
    });
    socket.on("message", (data, isBinary) => {
      const frame = parseFrame(isBinary ? data.toString() : data.toString("utf8"));
      if (frame) this.receive(socket, frame);
    });
    socket.on("error", (error) => {
      if (!this.stopped) this.options.logger.info(`safestop push: ${error.message}`);
    });
    socket.on("close", (code) => {
      this.connected = false;
      if (CLOSE_REFUSED.has(code)) refusedFor = code;
      if (this.stopped) return;
      if (refusedFor !== undefined) {
        // The server refused this token or run: retrying cannot help; the heartbeat still works.
        this.options.logger.warn(`safestop push refused (${refusedFor}); relying on heartbeats`);
        return;
      }
      if (Date.now() - openedAt >= 5000) this.backoffMs = this.options.minBackoffMs ?? 200;
      const wait =
        code === CLOSE_THROTTLED
          ? Math.max(this.backoffMs, this.options.throttledWaitMs ?? THROTTLED_WAIT_MS)
          : this.backoffMs;
      this.retryTimer = setTimeout(() => this.connect(), wait);
      this.backoffMs = Math.min(this.options.maxBackoffMs ?? 10_000, this.backoffMs * 2);
    });
  }

  private receive(socket: WebSocket, frame: JsonObject): void {
    const signal = stopSignalOf(frame);
    if (signal) {
      if (!this.options.onSignal(signal)) return;
      try {
        socket.send(JSON.stringify({ type: "ack", stop_epoch: signal.stop_epoch }));
      } catch {
        // A lost ack is covered by the next heartbeat, which acknowledges too.
      }
      return;
    }
    try {
      this.options.onFrame(frame);
    } catch (error) {
      this.options.logger.warn(`safestop push: frame handler failed: ${String(error)}`);
    }
  }
}

function parseFrame(text: string): JsonObject | undefined {
  try {
    const value: unknown = JSON.parse(text);
    return value !== null && typeof value === "object" && !Array.isArray(value)
      ? (value as JsonObject)
      : undefined;
  } catch {
    return undefined;
  }
}
