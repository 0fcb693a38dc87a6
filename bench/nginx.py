"""nginx in front of N daphne processes, run as the bench's own foreground process.

The proxy configuration is the committed one (deploy/nginx/safestop.conf, what docker compose
mounts); `render` swaps only what differs on a single machine: the upstream servers (loopback
ports instead of the `web` replicas Docker's DNS resolves), the listen address and the resolver.
`main_config` wraps it in a main context whose pid, logs and temp paths are under a directory of
ours, so the system's nginx (service, config, port 80) is never touched.

No Django here: tests/deploy imports it to run `nginx -t` on the shipped file.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from bench.common import Managed, start, wait_for_port

ROOT = Path(__file__).resolve().parent.parent
SHIPPED_CONF = ROOT / "deploy" / "nginx" / "safestop.conf"
UPSTREAM_NAME = "safestop_web"

# [ \t], not \s: a match must not swallow the blank lines around it.
_UPSTREAM_SERVERS = re.compile(r"^[ \t]*server[ \t]+\S+:\d+[^;\n]*;[ \t]*\n", re.MULTILINE)
_LISTEN = re.compile(r"^([ \t]*)listen[ \t]+80;", re.MULTILINE)
_RESOLVER = re.compile(r"^[ \t]*resolver[ \t]+[^;\n]*;[ \t]*\n", re.MULTILINE)


def nginx_binary() -> str:
    found = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else "")
    if not found:
        raise RuntimeError("nginx is not installed: run `bash scripts/ensure-nginx.sh`")
    return found


def render(conf: str, upstream_ports: list[int], listen_port: int) -> str:
    """The shipped http-level config with loopback upstreams and listen address."""
    servers = _UPSTREAM_SERVERS.findall(conf)
    if len(servers) != 1:
        raise ValueError(f"expected one upstream server line in the shipped config, got {servers}")
    indent = servers[0][: len(servers[0]) - len(servers[0].lstrip())]
    loopback = "".join(f"{indent}server 127.0.0.1:{port};\n" for port in upstream_ports)
    conf = _UPSTREAM_SERVERS.sub(lambda _match: loopback, conf, count=1)
    conf, listens = _LISTEN.subn(rf"\1listen 127.0.0.1:{listen_port};", conf)
    if listens != 1:
        raise ValueError("expected one `listen 80;` in the shipped config")
    return _RESOLVER.sub("", conf)


def main_config(http_include: str, workdir: Path, *, workers: str = "auto") -> str:
    """A whole nginx.conf around `http_include`; every path it writes is under `workdir`."""
    temp = {name: workdir / name for name in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")}
    for path in temp.values():
        path.mkdir(parents=True, exist_ok=True)
    return f"""daemon off;
worker_processes {workers};
# 1,000 viewers through the proxy hold 2,000 sockets (client side and upstream side).
worker_rlimit_nofile 20000;
pid {workdir / "nginx.pid"};
error_log {workdir / "error.log"} warn;
events {{
    worker_connections 8192;
}}
http {{
    access_log off;
    client_body_temp_path {temp["client_body"]};
    proxy_temp_path {temp["proxy"]};
    fastcgi_temp_path {temp["fastcgi"]};
    uwsgi_temp_path {temp["uwsgi"]};
    scgi_temp_path {temp["scgi"]};
{http_include}
}}
"""


def write_config(workdir: Path, upstream_ports: list[int], listen_port: int) -> Path:
    workdir.mkdir(parents=True, exist_ok=True)
    conf = main_config(render(SHIPPED_CONF.read_text(), upstream_ports, listen_port), workdir)
    path = workdir / "nginx.conf"
    path.write_text(conf)
    return path


def check(config: Path) -> subprocess.CompletedProcess[str]:
    """`nginx -t` on a config (its prefix is the config's directory)."""
    return subprocess.run(
        [nginx_binary(), "-t", "-p", str(config.parent), "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=30,
    )


@dataclass
class Proxy:
    port: int
    process: Managed

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        # SIGTERM to its process group: nginx's fast shutdown, master and workers.
        self.process.stop()


def start_proxy(
    workdir: Path, upstream_ports: list[int], listen_port: int, env: dict[str, str]
) -> Proxy:
    config = write_config(workdir, upstream_ports, listen_port)
    tested = check(config)
    if tested.returncode != 0:
        raise RuntimeError(f"nginx -t failed: {tested.stderr}")
    process = start(
        f"nginx-{len(upstream_ports)}",
        [nginx_binary(), "-p", str(workdir), "-c", str(config)],
        env,
        workdir,
    )
    wait_for_port(listen_port, timeout=15, process=process.process)
    return Proxy(listen_port, process)
