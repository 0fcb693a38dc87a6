/**
 * A live safestop server for the tests: `manage.py serve --no-demo` on a free port with its
 * own SQLite file (daphne + the background loop, websockets included), and an agent and a
 * reviewer token made with `manage.py create_api_token`. Stopped by its pid after the tests.
 */

import { spawn, execFile, type ChildProcess } from "node:child_process";
import { copyFileSync, existsSync, mkdtempSync, openSync, readFileSync, rmSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";

const run = promisify(execFile);

export interface LiveServer {
  baseUrl: string;
  agentToken: string;
  reviewerToken: string;
  repo: string;
  stop(): Promise<void>;
}

/** The repository root: the nearest parent with `manage.py` (or `SAFESTOP_REPO`). */
export function repoRoot(): string {
  if (process.env["SAFESTOP_REPO"]) return resolve(process.env["SAFESTOP_REPO"]);
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "manage.py"))) {
    const parent = dirname(dir);
    if (parent === dir) throw new Error("manage.py not found above the tests: set SAFESTOP_REPO");
    dir = parent;
  }
  return dir;
}

function freePort(): Promise<number> {
  return new Promise((resolvePort, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const address = server.address();
      const port = typeof address === "object" && address ? address.port : 0;
      server.close(() => resolvePort(port));
    });
  });
}

export async function startServer(): Promise<LiveServer> {
  const repo = repoRoot();
  const python = process.env["SAFESTOP_PYTHON"] ?? join(repo, ".venv", "bin", "python");
  if (!existsSync(python)) throw new Error(`no Python at ${python}: run 'make install' (or set SAFESTOP_PYTHON)`);
  const scratch = mkdtempSync(join(tmpdir(), "safestop-ts-"));
  const env: NodeJS.ProcessEnv = {
    ...process.env,
    SAFESTOP_SQLITE_PATH: join(scratch, "db.sqlite3"),
    // The outbox test's webhook: allowed, but only ever held for a reviewer who rejects it.
    SAFESTOP_WEBHOOK_ALLOWED_HOSTS: "127.0.0.1:9",
  };
  delete env["DATABASE_URL"];
  delete env["REDIS_URL"];
  const port = await freePort();
  const baseUrl = `http://127.0.0.1:${port}`;
  const logPath = join(scratch, "server.log");
  const log = openSync(logPath, "a");
  const server: ChildProcess = spawn(python, ["manage.py", "serve", "--no-demo", "--port", String(port)], {
    cwd: repo,
    env,
    stdio: ["ignore", log, log],
  });
  let exited = false;
  const exit = new Promise<void>((resolveExit) =>
    server.once("exit", () => {
      exited = true;
      resolveExit();
    }),
  );
  const stop = async (): Promise<void> => {
    if (!exited && server.pid !== undefined) {
      server.kill("SIGTERM");
      const killer = setTimeout(() => server.kill("SIGKILL"), 8000);
      await exit;
      clearTimeout(killer);
    }
    // Kept for a look after a failure: clients/typescript/dist/test-server.log.
    try {
      copyFileSync(logPath, join(dirname(fileURLToPath(import.meta.url)), "..", "..", "test-server.log"));
    } catch {
      // no log to keep
    }
    rmSync(scratch, { recursive: true, force: true });
  };
  try {
    const deadline = Date.now() + 60_000;
    for (;;) {
      if (exited) throw new Error(`the server exited:\n${readFileSync(logPath, "utf8")}`);
      try {
        const answer = await fetch(`${baseUrl}/api/v1/runs/`, { signal: AbortSignal.timeout(2000) });
        await answer.arrayBuffer();
        if (answer.status === 401 || answer.status === 403) break;
      } catch {
        // not listening yet
      }
      if (Date.now() > deadline) throw new Error(`the server did not answer in 60 s:\n${readFileSync(logPath, "utf8")}`);
      await new Promise((wake) => setTimeout(wake, 200));
    }
    const token = async (role: "agent" | "reviewer"): Promise<string> => {
      const { stdout } = await run(
        python,
        ["manage.py", "create_api_token", "--team", "ts-client", "--name", `ts-${role}`, "--role", role],
        { cwd: repo, env },
      );
      const lines = stdout.trim().split("\n");
      return (lines[lines.length - 1] ?? "").trim();
    };
    const agentToken = await token("agent");
    const reviewerToken = await token("reviewer");
    return { baseUrl, agentToken, reviewerToken, repo, stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

/** Poll `probe` until it returns a value other than undefined. */
export async function waitFor<T>(probe: () => Promise<T | undefined>, what: string, timeoutMs = 15_000, intervalMs = 50): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await probe();
    if (value !== undefined) return value;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((wake) => setTimeout(wake, intervalMs));
  }
}
