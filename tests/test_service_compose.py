"""docker-compose.yml's security defaults: nothing published beyond 127.0.0.1 unless the operator
opts in, no password with a default, Redis with a password and its append-only file, Streamlit's
usage statistics off. Checked with `docker compose config` where the compose plugin is
installed, else by interpolating the file as compose does (${VAR}, ${VAR:-default},
${VAR:?message})."""
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "docker-compose.yml"
SECRETS = {"POSTGRES_PASSWORD": "pg-secret-from-env", "REDIS_PASSWORD": "redis-secret-from-env"}
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


class Missing(Exception):
    pass


def interpolate(value, env):
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def sub(m):
        name, op, arg = m.group(1), m.group(2), m.group(3)
        if env.get(name):
            return env[name]
        if op in (":?", "?"):
            raise Missing(f"{name}: {arg}")
        return arg if op in (":-", "-") else ""
    return _VAR.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def config(env: dict) -> dict:
    """The resolved compose file, by `docker compose config` if present."""
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        r = subprocess.run([docker, "compose", "-f", str(COMPOSE), "config", "--format", "json"],
                           env={"PATH": "/usr/bin:/bin", **env}, capture_output=True, text=True)
        if r.returncode:
            raise Missing(r.stderr)
        return json.loads(r.stdout)
    import yaml
    return interpolate(yaml.safe_load(COMPOSE.read_text()), env)


def _published(svc: dict):
    for p in svc.get("ports", []):
        if isinstance(p, dict):
            yield p.get("host_ip", "")
        else:
            parts = str(p).split(":")
            yield parts[0] if len(parts) == 3 else ""


def test_no_password_has_a_default():
    with pytest.raises(Missing):
        config({})
    text = COMPOSE.read_text()
    assert not re.search(r"PASSWORD:-", text), "a password with a default"


def test_nothing_published_beyond_loopback_by_default():
    c = config(SECRETS)
    hosts = {name: list(_published(svc)) for name, svc in c["services"].items()}
    assert any(hosts.values()), "the dashboard is published"
    for name, ips in hosts.items():
        assert all(ip == "127.0.0.1" for ip in ips), (name, ips)
    exposed = config(dict(SECRETS, PORTER_DASHBOARD_BIND="0.0.0.0"))
    assert list(_published(exposed["services"]["dashboard"])) == ["0.0.0.0"]


def test_secrets_come_from_the_environment():
    c = config(SECRETS)
    text = json.dumps(c)
    assert "pg-secret-from-env" in text and "redis-secret-from-env" in text
    assert ":porter@" not in text, "the old default password"
    redis = c["services"]["redis"]
    cmd = redis["command"] if isinstance(redis["command"], list) else redis["command"].split()
    assert cmd[cmd.index("--requirepass") + 1] == "redis-secret-from-env"
    assert cmd[cmd.index("--appendonly") + 1] == "yes"
    for name, svc in c["services"].items():
        url = (svc.get("environment") or {}).get("PORTER_BROKER_URL")
        if url:
            assert ":redis-secret-from-env@" in url, name
    dash = c["services"]["dashboard"]["environment"]
    assert dash["STREAMLIT_BROWSER_GATHER_USAGE_STATS"] == "false"
