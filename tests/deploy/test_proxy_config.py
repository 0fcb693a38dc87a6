"""The shipped production topology (docs/OPERATIONS.md, "Running at scale"): nginx in front of
a `web` service that scales, configured by deploy/nginx/safestop.conf.

No Docker engine is needed: the compose file is read as YAML, and the nginx config is checked by
the real nginx (`nginx -t`, installed by `make test` through scripts/ensure-nginx.sh) after
bench/nginx.py swaps Docker's service name for loopback ports, exactly as the scale-out bench
runs it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from bench import nginx

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
CONF = nginx.SHIPPED_CONF


@pytest.fixture(scope="module")
def services() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]


@pytest.fixture(scope="module")
def conf() -> str:
    return CONF.read_text()


def test_web_scales_because_it_publishes_no_host_port(services):
    web = services["web"]
    assert "ports" not in web, "a fixed host port makes `--scale web=N` collide"
    assert [str(port) for port in web["expose"]] == ["8000"]
    assert "--proxy-headers" in web["command"]
    assert "container_name" not in web


def test_web_gives_a_reconnect_storm_time_to_handshake(services):
    command = services["web"]["command"]
    timeout = int(command[command.index("--websocket_connect_timeout") + 1])
    assert timeout >= 20  # daphne's CLI default of 5 s refuses sockets under a storm


def test_nginx_is_the_published_entry_and_mounts_the_committed_config(services):
    proxy = services["nginx"]
    mounts = [volume.split(":") for volume in proxy["volumes"]]
    assert ["./deploy/nginx/safestop.conf", "/etc/nginx/conf.d/default.conf", "ro"] in mounts
    assert (ROOT / "deploy" / "nginx" / "safestop.conf").is_file()
    assert [port.split(":")[-1] for port in proxy["ports"]] == ["80"]
    assert proxy["depends_on"]["web"]["condition"] == "service_healthy"
    # `resolve` in an upstream needs open-source nginx >= 1.27.3
    major, minor = (int(part) for part in proxy["image"].split(":")[1].split(".")[:2])
    assert (major, minor) >= (1, 28)


def test_upstream_resolves_every_web_replica_through_dockers_dns(conf, services):
    web_port = str(services["web"]["expose"][0])
    assert re.search(rf"^\s*server\s+web:{web_port}\s+resolve;", conf, re.MULTILINE)
    assert re.search(r"^\s*zone\s+\S+\s+\d+k;", conf, re.MULTILINE)
    assert re.search(r"^\s*resolver\s+127\.0\.0\.11\b", conf, re.MULTILINE)


def test_idle_upstream_connections_close_on_nginx_side_first(conf):
    import twisted.web.http

    upstream = conf[re.search(r"^upstream\s", conf, re.MULTILINE).start() :]  # type: ignore[union-attr]
    upstream = upstream[: upstream.index("}")]
    idle = re.search(r"keepalive_timeout\s+(\d+)s;", upstream)
    assert idle is not None and "keepalive " in upstream
    # daphne's HTTP channel closes an idle keep-alive connection after Twisted's request timeout
    assert int(idle.group(1)) < twisted.web.http._REQUEST_TIMEOUT


def test_websockets_are_upgraded_and_kept_open(conf):
    assert "proxy_http_version 1.1;" in conf
    assert "proxy_set_header Upgrade $http_upgrade;" in conf
    assert "proxy_set_header Connection $connection_upgrade;" in conf
    ws = conf[conf.index("location /ws/") :]
    ws = ws[: ws.index("}")]
    read_timeout = re.search(r"proxy_read_timeout\s+(\d+)([smh]);", ws)
    assert read_timeout is not None
    seconds = int(read_timeout.group(1)) * {"s": 1, "m": 60, "h": 3600}[read_timeout.group(2)]
    # longer than the agent's heartbeat and a quiet browser tab, or nginx cuts the socket
    assert seconds >= 600
    assert "proxy_buffering off;" in ws


def test_daphne_gets_the_client_address_the_client_cannot_forge(conf):
    # daphne --proxy-headers reads the FIRST X-Forwarded-For entry: it must be nginx's view
    assert "proxy_set_header X-Forwarded-For $remote_addr;" in conf
    assert "$proxy_add_x_forwarded_for" not in conf
    # daphne takes X-Forwarded-Port as the client's port, not the proxy's
    assert "proxy_set_header X-Forwarded-Port $remote_port;" in conf
    assert "proxy_set_header X-Forwarded-Proto $scheme;" in conf
    # the port too, or a published port other than 80 fails Django's CSRF Origin check
    assert "proxy_set_header Host $http_host;" in conf


def test_rendering_swaps_only_the_upstream_listen_and_resolver(conf):
    rendered = nginx.render(conf, [8101, 8102, 8103], 18080)
    assert re.findall(r"^\s*server\s+(\S+);", rendered, re.MULTILINE) == [
        "127.0.0.1:8101",
        "127.0.0.1:8102",
        "127.0.0.1:8103",
    ]
    assert "listen 127.0.0.1:18080;" in rendered
    assert "resolver" not in re.sub(r"#.*", "", rendered)
    untouched = [
        line
        for line in conf.splitlines()
        if not re.match(r"\s*(server\s+web|listen|resolver)", line)
    ]
    assert untouched == [
        line for line in rendered.splitlines() if not re.match(r"\s*(server\s+127|listen)", line)
    ]


# Slow by hand (tests/conftest.py): they run the nginx binary, which `make test-fast` does not install.
@pytest.mark.slow
def test_nginx_accepts_the_shipped_config(tmp_path):
    config = nginx.write_config(tmp_path, [8101, 8102], 18080)
    checked = nginx.check(config)
    assert checked.returncode == 0, checked.stderr
    assert "test is successful" in checked.stderr


@pytest.mark.slow
def test_nginx_rejects_a_broken_config(tmp_path):
    # the check above can fail: a config nginx cannot parse is reported, not waved through
    config = nginx.write_config(tmp_path, [8101], 18080)
    config.write_text(config.read_text().replace("proxy_http_version 1.1;", "proxy_http_version;"))
    assert nginx.check(config).returncode != 0
