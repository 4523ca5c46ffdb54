"""A job owns its template: a snapshot stored with the job, loaded from there by every later step
(resume, export, report, record), never again from the folder on disk."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from porter.errors import TemplateError
from porter.spec import snapshot
from porter.spec.template import BUILTIN_DIR, load_template

# the store conformance suite's databases (SQLite, and PostgreSQL where it runs)
from test_db import G, make_job, pg_url, store, tpl, url  # noqa: F401,F811

ROOT = Path(__file__).resolve().parents[1]


def porter(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "porter.cli", *args], capture_output=True,
                          text=True, cwd=cwd or ROOT, timeout=300)


def copy_template(dst: Path, name: str = "my_rmsnorm") -> Path:
    folder = dst / name
    shutil.copytree(BUILTIN_DIR / "rmsnorm", folder)
    space = folder / "space.toml"
    space.write_text(space.read_text().replace('name = "rmsnorm"', f'name = "{name}"', 1))
    (folder / "notes.txt").write_text("kept with the template\n")
    return folder


def test_bundle_hash_covers_every_file_and_the_included_headers(tmp_path):
    folder = copy_template(tmp_path)
    a = snapshot.bundle(folder)
    assert {"space.toml", "kernel.cu", "notes.txt", "_include/porter.cuh"} <= set(a.files)
    assert snapshot.unpack(a.blob) == dict(a.files)
    assert load_template(folder).source_hash == a.hash
    (folder / "notes.txt").write_text("changed\n")
    assert snapshot.bundle(folder).hash != a.hash


def test_materialized_snapshot_loads_the_same_template(tmp_path, monkeypatch):
    monkeypatch.setenv("PORTER_CACHE_DIR", str(tmp_path / "cache"))
    folder = copy_template(tmp_path)
    snap = snapshot.bundle(folder)
    tpl = snapshot.load_snapshot(snap.hash, snap.blob)
    assert tpl.name == "my_rmsnorm" and tpl.source_hash == snap.hash
    assert tpl.include_dir is not None and (tpl.include_dir / "porter.cuh").is_file()
    assert tpl.source == load_template(folder).source
    with pytest.raises(TemplateError):
        snapshot.materialize("../../etc", snap.blob)
    evil = snapshot.pack({"../outside.txt": b"x", "space.toml": b""})
    with pytest.raises(TemplateError, match="outside"):
        snapshot.materialize("0123456789abcdef", evil)


def test_a_job_outlives_its_template_folder(tmp_path):
    """Acceptance: port from --templates-dir, delete the folder, then export (cu, python,
    cubin), report, record and resume all work from the job's snapshot."""
    tdir = tmp_path / "templates"
    copy_template(tdir)
    db = f"sqlite:///{tmp_path / 'p.db'}"
    r = porter("port", "my_rmsnorm", "--arch", "sm_90a", "--backend", "compile-only",
               "--trials", "3", "--sizes", "4096x4096", "--templates-dir", str(tdir), "--db", db)
    assert r.returncode == 0, r.stderr + r.stdout
    shutil.rmtree(tdir)
    for fmt in ("cu", "python", "cubin"):
        out = tmp_path / f"out_{fmt}"
        r = porter("export", "1", "--format", fmt, "-o", str(out), "--db", db)
        assert r.returncode == 0, (fmt, r.stderr + r.stdout)
        assert any(out.rglob("*")), fmt
    r = porter("report", "1", "--db", db)
    assert r.returncode == 0 and "my_rmsnorm" in r.stdout, r.stderr + r.stdout
    r = porter("record", "1", "-o", str(tmp_path / "rec.json"), "--db", db)
    assert r.returncode == 0, r.stderr + r.stdout
    assert '"my_rmsnorm"' in (tmp_path / "rec.json").read_text()
    # the name on the command line is not looked up again: the job's snapshot is the template
    r = porter("port", "my_rmsnorm", "--arch", "sm_90a", "--resume", "1", "--db", db)
    assert r.returncode == 0, r.stderr + r.stdout
    from db.store import open_store
    assert len(open_store(db).trials(1)) == 3


def test_jobs_of_one_unchanged_template_share_a_snapshot_row(tmp_path):
    from db.store import open_store
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.spec.snapshot import job_template
    folder = copy_template(tmp_path / "t")
    store = open_store(f"sqlite:///{tmp_path / 'p.db'}")

    def make():
        spec, tpl, _ = make_spec(str(folder), "sm_90a", backend="compile-only")
        src, space = template_record(tpl)
        return store.create_job(spec, tpl.name, tpl.source_hash, src, space,
                                snapshot=template_snapshot(tpl))

    first, second = make(), make()
    kernel = folder / "kernel.cu"
    kernel.write_text(kernel.read_text() + "\n// edited after two jobs\n")
    third = make()
    from db.engine import get_engine
    with get_engine(store.url).connect() as conn:
        n = conn.execute(sa.text("select count(*) from porter_templates")).scalar()
    assert n == 2
    assert store.get_job(first).template_hash == store.get_job(second).template_hash
    old = job_template(store, first)
    assert "edited after two jobs" not in old.source
    assert "edited after two jobs" in job_template(store, third).source


def test_databases_from_before_snapshots_upgrade(tmp_path):
    """A job recorded under migration 0001 loads its template from the upgraded row."""
    from db import migrate
    from db.engine import get_engine
    url = f"sqlite:///{tmp_path / 'old.db'}"
    migrate.upgrade(url, "0001")
    src = (BUILTIN_DIR / "rmsnorm" / "kernel.cu").read_text()
    space = (BUILTIN_DIR / "rmsnorm" / "space.toml").read_text()
    with get_engine(url).begin() as conn:
        conn.execute(sa.text(
            "insert into porter_templates (source_hash, name, version, source, space_text, "
            "created_at) values ('00aa11bb22cc33dd', 'rmsnorm', '1', :s, :t, 0)"),
            {"s": src, "t": space})
        conn.execute(sa.text(
            "insert into porter_jobs (spec, template_name, template_hash, arch, status, message,"
            " created_at, study_name, cancel_requested) values (:spec, 'rmsnorm', "
            "'00aa11bb22cc33dd', 'sm_90a', 'done', '', 0, 'porter-job-1', 0)"),
            {"spec": '{"template": "rmsnorm", "arch": "sm_90a", "sizes": [[4096, 4096]]}'})
    from db.store import open_store
    store = open_store(url)
    tpl = snapshot.job_template(store, 1)
    assert tpl.name == "rmsnorm" and tpl.source == src


def test_grids_follow_the_target_multiprocessor_count():
    """No device constant in a template: gemm_wgmma's persistent and stream-K grids use
    arch_sms, the table's (132 for sm_90a) or a product's (an H100 PCIe has 114)."""
    import re
    from porter.job.jobs import make_spec
    from porter.spec.arch import resolve_arch
    assert not re.search(r"\b132\b", "".join(
        p.read_text() for p in BUILTIN_DIR.rglob("*") if p.suffix in (".toml", ".cu")))
    spec, tpl, arch = make_spec("gemm_wgmma", "sm_90a", ["4096x4096x4096"],
                                backend="compile-only", sms=114)
    assert arch.sms == 114 and spec.sms == 114
    base = {k: v[0] for k, v in tpl.params.items()}
    for extra, per in (({"STREAMK": 2}, lambda n, c: c * (n // c)),
                       ({"PERSIST": 1}, lambda n, c: c * min(n // c, 32 * 16))):
        cfg = {**base, **extra}
        for sms in (114, 132):
            grid = tpl.launch(cfg, resolve_arch("sm_90a", sms), (4096, 4096, 4096)).grid
            assert grid[0] == per(sms, cfg["CLUSTER"]), (extra, sms, grid)


def test_template_snapshots(store, tpl):
    """The snapshot a job stores comes back byte for byte; one row per hash; a job created
    without one still has a bundle of its source and space file."""
    from porter.errors import StoreError
    from porter.records import JobSpec
    from porter.spec.snapshot import pack, unpack
    import hashlib
    files = {"space.toml": b'[template]\nname = "x"\n', "kernel.cu": b"// k\n",
             "sub/t1.json": bytes(range(256))}
    spec = JobSpec(template=tpl, arch="sm_90a", sizes=(G,))
    h = hashlib.sha256(tpl.encode()).hexdigest()[:16]
    a = store.create_job(spec, tpl, h, "// k\n", '[template]\nname = "x"\n', snapshot=pack(files))
    b = store.create_job(spec, tpl, h, "// k\n", '[template]\nname = "x"\n',
                         snapshot=pack({"other": b""}))
    assert store.get_job(a).template_hash == store.get_job(b).template_hash == h
    assert unpack(store.template_snapshot(h)) == files      # the first snapshot of a hash stays
    job = make_job(store, tpl)
    old = unpack(store.template_snapshot(store.get_job(job).template_hash))
    assert old == {"space.toml": b'[template]\nname = "x"\nversion = "2"\n',
                   "kernel.cu": b"__global__ void k() {}"}
    with pytest.raises(StoreError):
        store.template_snapshot("ffffffffffffffff")
