"""A throwaway PostgreSQL server for benchmarks/service_scaling.py: from the archive that
scripts/carry_postgres.sh packs (the lent GPU machine has no PostgreSQL), else from this machine's
own binaries. The server runs from a temporary folder, on a free port of 127.0.0.1 only, with
trust authentication, as an unprivileged user when this process is root (the server refuses
root), with the time zone GMT (built into the server; no zoneinfo files needed).

    python3 benchmarks/_service_pg.py --check [.pgsql]     # start one, query it, stop it
"""
from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

SETTINGS = {"listen_addresses": "127.0.0.1", "unix_socket_directories": "",
            "timezone": "GMT", "log_timezone": "GMT", "max_connections": "200",
            "dynamic_shared_memory_type": "mmap"}


def _free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unprivileged() -> tuple[int, int] | None:
    """(uid, gid) to run the server as: None when this process is not root; else `nobody`, or
    the first ordinary user of the passwd file (the server looks its user up by id)."""
    if os.geteuid() != 0:
        return None
    try:
        p = pwd.getpwnam("nobody")
        return p.pw_uid, p.pw_gid
    except KeyError:
        pass
    for p in pwd.getpwall():
        if p.pw_uid >= 1000:
            return p.pw_uid, p.pw_gid
    raise RuntimeError("this process is root and no unprivileged user exists to run "
                       "PostgreSQL as (the server refuses root): add one (useradd)")


def unpack(carried: Path | None, work: Path) -> Path | None:
    """The archive scripts/carry_postgres.sh wrote into `carried`, unpacked under work (readable
    by every user); None where there is none."""
    archive = carried / "pgsql.tar.xz" if carried else None
    if archive is None or not archive.is_file():
        return None
    root = work / "pgsql"
    with tarfile.open(archive) as tar:
        tar.extractall(root, filter="fully_trusted")
    os.chmod(root, 0o755)
    return root


def use_zoneinfo(root: Path | None) -> None:
    """Adds the packed UTC zone file to Python's time zone path, here and in the processes this
    one starts (kombu, under Celery, needs ZoneInfo("UTC") at import)."""
    if root is None or not (root / "zoneinfo/UTC").is_file():
        return
    import zoneinfo
    path = [p for p in zoneinfo.TZPATH] + [str(root / "zoneinfo")]
    os.environ["PYTHONTZPATH"] = os.pathsep.join(path)
    zoneinfo.reset_tzpath(path)


def redis_from(root: Path | None) -> tuple[list[str], dict] | None:
    """(argv, env) of the redis-server packed beside PostgreSQL, if it was."""
    if root is None or not (root / "bin/redis-server").is_file():
        return None
    return [str(root / "bin/redis-server")], dict(os.environ, LD_LIBRARY_PATH=str(root / "lib"))


class PgServer:
    """start() -> the server's admin URL (database postgres, user postgres); stop(). root: an
    unpacked archive (unpack()), or None for this machine's own binaries."""

    def __init__(self, root: Path | None, work: Path, log: Path, settings: dict | None = None):
        self.root, self.work, self.logpath = root, work, log
        self.settings = dict(SETTINGS, **(settings or {}))
        self.proc: subprocess.Popen | None = None
        self.info: dict = {}

    def _binaries(self) -> tuple[Path, dict]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        if self.root is not None:
            bindir = Path(sorted(glob.glob(str(self.root / "usr/lib/postgresql/*/bin")))[-1])
            env["LD_LIBRARY_PATH"] = str(self.root / "lib")
            self.info["how"] = f"carried (scripts/carry_postgres.sh, unpacked in {self.root})"
            return bindir, env
        exe = shutil.which("postgres") or (sorted(glob.glob("/usr/lib/postgresql/*/bin/"
                                                            "postgres")) or [None])[-1]
        if exe is None:
            raise RuntimeError("no PostgreSQL here and no .pgsql/pgsql.tar.xz: run "
                               "scripts/carry_postgres.sh where PostgreSQL is installed and "
                               "carry .pgsql")
        self.info["how"] = "this machine's own binaries"
        return Path(os.path.realpath(exe)).parent, env

    def start(self, timeout: float = 60) -> str:
        self.work.mkdir(parents=True, exist_ok=True)
        os.chmod(self.work, 0o755)
        bindir, env = self._binaries()
        who = _unprivileged()
        as_user = {"user": who[0], "group": who[1], "extra_groups": []} if who else {}
        data = self.work / "pgdata"
        data.mkdir(mode=0o700)
        if who:
            os.chown(data, *who)
        t = time.time()
        with open(self.logpath, "ab") as log:
            r = subprocess.run([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                                "--auth=trust", "--encoding=UTF8", "--locale=C", "--no-sync"],
                               env=env, cwd=self.work, stdout=log, stderr=subprocess.STDOUT,
                               timeout=timeout, **as_user)
        if r.returncode != 0:
            raise RuntimeError(f"initdb failed ({r.returncode}): "
                               + self.logpath.read_text(errors="replace")[-600:])
        port = _free_port()
        argv = [str(bindir / "postgres"), "-D", str(data), "-p", str(port)]
        for k, v in self.settings.items():
            argv += ["-c", f"{k}={v}"]
        log = open(self.logpath, "ab")
        self.proc = subprocess.Popen(argv, env=env, cwd=self.work, stdout=log,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     process_group=0, **as_user)
        log.close()
        url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
        self._wait(port, t + timeout)
        version = subprocess.run([str(bindir / "postgres"), "--version"], env=env,
                                 capture_output=True, text=True).stdout.strip()
        import psycopg
        with psycopg.connect(host="127.0.0.1", port=port, user="postgres",
                             dbname="postgres") as c:
            durable = {k: c.execute(f"SHOW {k}").fetchone()[0]
                       for k in ("fsync", "synchronous_commit", "shared_buffers")}
        self.info.update(version=version, port=port, user=pwd.getpwuid(who[0]).pw_name
                         if who else pwd.getpwuid(os.geteuid()).pw_name,
                         start_s=round(time.time() - t, 2),
                         settings=dict(self.settings, **durable))
        return url

    def _wait(self, port: int, until: float) -> None:
        import psycopg
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited ({self.proc.returncode}): "
                                   + self.logpath.read_text(errors="replace")[-600:])
            try:
                psycopg.connect(host="127.0.0.1", port=port, user="postgres",
                                dbname="postgres", connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.time() > until:
                    raise RuntimeError("postgres did not accept connections in time: "
                                       + self.logpath.read_text(errors="replace")[-600:])
                time.sleep(0.2)

    def stop(self) -> None:
        """A fast shutdown (SIGINT), then SIGKILL to its process group after 15 s."""
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGINT)
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(5)


def _check(carried: Path) -> None:
    import psycopg
    work = Path(tempfile.mkdtemp(prefix="porter-pgcheck-"))
    os.chmod(work, 0o755)
    root = unpack(carried, work)
    pg = PgServer(root, work, work / "postgres.log")
    try:
        url = pg.start()
        with psycopg.connect(host="127.0.0.1", port=pg.info["port"], user="postgres",
                             dbname="postgres", autocommit=True) as c:
            c.execute('CREATE DATABASE "porter_check"')
            tz = c.execute("SHOW timezone").fetchone()[0]
            n = c.execute("SELECT count(*) FROM pg_extension WHERE extname='plpgsql'"
                          ).fetchone()[0]
        print(f"ok: {pg.info['version']} as {pg.info['user']} ({pg.info['how']}), {url}, "
              f"started in {pg.info['start_s']} s, time zone {tz}, plpgsql {n}")
        use_zoneinfo(root)
        import zoneinfo
        print(f"ok: time zone {zoneinfo.ZoneInfo('UTC')} (path {os.pathsep.join(zoneinfo.TZPATH)})")
        redis = redis_from(root)
        if redis:
            argv, env = redis
            out = subprocess.run(argv + ["--version"], env=env, capture_output=True, text=True,
                                 timeout=20)
            print(f"ok: {out.stdout.strip() or out.stderr.strip()}" if out.returncode == 0
                  else f"error: the packed redis-server does not start: {out.stderr.strip()}")
    finally:
        pg.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--check":
        _check(Path(sys.argv[2] if len(sys.argv) > 2 else ".pgsql").resolve())
    else:
        print(__doc__)
