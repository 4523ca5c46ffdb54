"""The template a job owns: a content-addressed snapshot of the whole template folder.

When a job is created, every file of its template folder (space file, sources, T1 file, ...)
and every header of porter's include folder that the sources include are bundled into one blob
whose hash names it. The store keeps one row per hash, so jobs of an unchanged template share
it. Resume, export, report, record, the service's workers and the dashboard load the template
from that blob (`job_template`), never again from disk by name or path: a template edited or
deleted after the job was made changes nothing for the job.

- `bundle(folder)` -> Snapshot: the files, their hash and the zlib-compressed blob.
- `unpack(blob)` -> {path: bytes}; `materialize(hash, blob)` -> a folder under the cache
  directory holding exactly those files (written once, atomically; read-only afterwards).
- `job_template(store, job)` -> the job's Template, loaded from its snapshot; `job_parts` adds
  the JobInfo and the Arch (with the job's multiprocessor count).
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from porter.errors import TemplateError

INCLUDE_PREFIX = "_include/"      # where the included porter headers sit inside a snapshot
MAX_BYTES = 32 * 1024 * 1024      # a template folder larger than this is refused
_SKIP_DIRS = {"__pycache__", ".git", ".ipynb_checkpoints"}
_INCLUDE_RE = re.compile(r'^\s*#\s*include\s*["<]([^">]+)[">]', re.M)


@dataclass(frozen=True)
class Snapshot:
    hash: str                      # 16 hex digits over every (path, content)
    files: Mapping[str, bytes]     # path inside the template folder -> content
    blob: bytes                    # what the store keeps


def content_hash(files: Mapping[str, bytes]) -> str:
    h = hashlib.sha256()
    for path in sorted(files):
        h.update(path.encode() + b"\0" + hashlib.sha256(files[path]).digest())
    return h.hexdigest()[:16]


def pack(files: Mapping[str, bytes]) -> bytes:
    doc = {p: files[p].hex() for p in sorted(files)}
    return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)


def unpack(blob: bytes) -> dict[str, bytes]:
    try:
        doc = json.loads(zlib.decompress(blob))
        return {str(p): bytes.fromhex(v) for p, v in doc.items()}
    except (zlib.error, ValueError, AttributeError) as e:
        raise TemplateError(f"a stored template snapshot is damaged ({e})") from None


def _included_headers(files: Mapping[str, bytes], include_dir: Path) -> dict[str, bytes]:
    """porter headers the sources include, transitively (they are part of what compiles)."""
    out: dict[str, bytes] = {}
    todo = [c for p, c in files.items() if p.endswith((".cu", ".cuh", ".h"))]
    while todo:
        text = todo.pop().decode("utf-8", "replace")
        for name in _INCLUDE_RE.findall(text):
            path = (include_dir / name).resolve()
            key = INCLUDE_PREFIX + name
            if key in out or include_dir.resolve() not in path.parents or not path.is_file():
                continue
            out[key] = path.read_bytes()
            todo.append(out[key])
    return out


def bundle(folder: str | Path, include_dir: Path | None = None) -> Snapshot:
    """Every file of a template folder (and the porter headers it includes) as one snapshot."""
    from porter.spec.template import INCLUDE_DIR
    folder = Path(folder)
    files: dict[str, bytes] = {}
    total = 0
    for root, dirs, names in os.walk(folder):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for n in sorted(names):
            if n.startswith(".") or n.endswith((".pyc", ".pyo")):
                continue
            p = Path(root) / n
            if p.is_symlink() or not p.is_file():
                continue
            rel = p.relative_to(folder).as_posix()
            if rel.startswith(INCLUDE_PREFIX):
                continue
            data = p.read_bytes()
            total += len(data)
            if total > MAX_BYTES:
                raise TemplateError(f"template folder {folder} holds more than "
                                    f"{MAX_BYTES // 2**20} MiB; keep only the template's files "
                                    "there")
            files[rel] = data
    files.update(_included_headers(files, include_dir or INCLUDE_DIR))
    return Snapshot(content_hash(files), files, pack(files))


def from_record(source: str, space_text: str) -> Snapshot:
    """A snapshot of a job recorded before snapshots existed: its source (under the name its
    space file gives, kernel.cu by default) and space file."""
    import tomllib
    try:
        name = str(tomllib.loads(space_text).get("template", {}).get("source", "kernel.cu"))
    except tomllib.TOMLDecodeError:
        name = "kernel.cu"
    files = {"space.toml": space_text.encode(), name: source.encode()}
    return Snapshot(content_hash(files), files, pack(files))


def _cache_root() -> Path:
    from porter.build.compile import cache_dir
    return cache_dir() / "snapshots"


def materialize(hash_: str, blob: bytes) -> Path:
    """The snapshot's files in a folder of their own (cache dir / snapshots / hash)."""
    if not re.fullmatch(r"[0-9a-f]{8,64}", hash_):
        raise TemplateError(f"not a snapshot hash: {hash_!r}")
    dest = _cache_root() / hash_
    if (dest / ".complete").is_file():
        return dest
    files = unpack(blob)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{hash_}.", dir=dest.parent))
    try:
        for rel, data in files.items():
            p = (tmp / rel).resolve()
            if tmp.resolve() not in p.parents:
                raise TemplateError(f"snapshot {hash_} names a path outside itself: {rel!r}")
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(data)
        (tmp / ".complete").write_text(hash_)
        try:
            os.replace(tmp, dest)
        except OSError:            # another process got there first: theirs is the same files
            pass
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def load_snapshot(hash_: str, blob: bytes, variant: str | None = None):
    """The Template a snapshot holds, compiled against the headers it carries; variant: the
    name of one of its [variants] (porter.spec.variants), else the base."""
    from porter.spec.template import load_template
    folder = materialize(hash_, blob)
    inc = folder / INCLUDE_PREFIX.rstrip("/")
    return load_template(folder, include_dir=inc if inc.is_dir() else None,
                         source_hash=hash_, variant=variant)


def job_template(store, job):
    """The Template a job owns (job: a JobInfo or a job id), the variant its name says."""
    info = store.get_job(job) if isinstance(job, int) else job
    blob = store.template_snapshot(info.template_hash)
    return load_snapshot(info.template_hash, blob, variant=info.spec.template)


def job_parts(store, job):
    """(JobInfo, Template, Arch) of a job, all from what the job stored."""
    from porter.spec.arch import resolve_arch
    info = store.get_job(job) if isinstance(job, int) else job
    return info, job_template(store, info), resolve_arch(info.spec.arch, info.spec.sms)
