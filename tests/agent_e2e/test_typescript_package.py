"""`@safestop/agent` as npm publishes it: `npm pack` in a fresh copy of clients/typescript builds
the package itself (`prepack`), and the tarball installs into a fresh Node project whose own
code imports it by name and runs an agent against a live server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest

from runs.models import Run, RunStatus

pytestmark = pytest.mark.django_db(transaction=True)

REPO = Path(__file__).resolve().parents[2]
CLIENT = REPO / "clients" / "typescript"
NPM = shutil.which("npm") or "npm"
NODE = shutil.which("node") or "node"

# A fresh project's own code: the package by name, ESM, as a user writes it.
AGENT = """
import { SafestopClient, ToolCallConflict } from "@safestop/agent";

const client = new SafestopClient({ baseUrl: process.env.SAFESTOP_URL, token: process.env.SAFESTOP_TOKEN });
const created = await client.createRun({ title: "From the npm tarball", agent: "npm-pack" });
const outcome = await client.withLease(created.id, "npm-worker", async (run) => {
  const found = await run.toolCall("lookup", { q: "x" }, async () => ({ hits: 3 }));
  await run.complete({ found });
  return found;
});
console.log(JSON.stringify({ run: created.id, value: outcome.value, conflictClass: typeof ToolCallConflict }));
"""


def _run(argv: list[str | Path], **options: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(arg) for arg in argv], capture_output=True, text=True, timeout=600, **options
    )
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def tarball(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`npm ci && npm pack` in a copy of the client as a fresh clone has it: no dist/."""
    source = tmp_path_factory.mktemp("clone") / "typescript"
    shutil.copytree(CLIENT, source, ignore=shutil.ignore_patterns("node_modules", "dist", "*.tgz"))
    quiet = ["--no-audit", "--no-fund", "--loglevel=error"]
    _run([NPM, "ci", *quiet], cwd=source)
    packed = _run([NPM, "pack", "--json", "--loglevel=error"], cwd=source)
    (entry,) = json.loads(packed.stdout[packed.stdout.index("[") :])
    return source / entry["filename"]


def test_npm_pack_builds_the_package_it_packs(tarball):
    with tarfile.open(tarball) as archive:
        names = set(archive.getnames())
    manifest = json.loads((CLIENT / "package.json").read_text())
    for entry in ("main", "types"):
        assert f"package/{manifest[entry]}" in names, f"{manifest[entry]} missing"
    built = {name for name in names if name.startswith("package/dist/src/")}
    sources = {f"package/dist/src/{path.stem}.js" for path in (CLIENT / "src").glob("*.ts")}
    assert sources <= built
    assert not any(
        name.startswith(("package/dist/test/", "package/node_modules/")) for name in names
    )


def test_the_tarball_installs_into_a_fresh_project_and_runs_an_agent(tarball, stack, tmp_path):
    project = tmp_path / "fresh-project"
    project.mkdir()
    (project / "package.json").write_text(
        json.dumps({"name": "fresh-project", "private": True, "type": "module"})
    )
    _run([NPM, "install", "--no-audit", "--no-fund", "--loglevel=error", tarball], cwd=project)
    (project / "agent.mjs").write_text(AGENT)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(tmp_path),
        "SAFESTOP_URL": stack.url,
        "SAFESTOP_TOKEN": stack.agent_raw,
    }
    done = _run([NODE, "agent.mjs"], cwd=project, env=env)
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["value"] == {"hits": 3}
    assert answer["conflictClass"] == "function"
    run = Run.objects.get(pk=answer["run"])
    assert (run.status, run.result) == (RunStatus.COMPLETED, {"found": {"hits": 3}})
