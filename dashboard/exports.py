"""Export downloads: porter.export.export into a temporary folder, zipped. The bytes are kept per
(database, job, format, job version), so a second click serves the same archive."""
from __future__ import annotations

import io
import tempfile
import threading
import zipfile
from pathlib import Path

_cache: dict[tuple, bytes] = {}
_lock = threading.Lock()


def export_zip(url: str, job_id: int, fmt: str, version: tuple) -> bytes:
    """A zip of `porter export JOB --format FMT`; a PorterError becomes ERROR.txt inside the
    archive (a download callback has no page to show a message on)."""
    key = (url, job_id, fmt, version)
    with _lock:
        if key in _cache:
            return _cache[key]
    from porter.errors import PorterError
    from porter.export.export import export

    from .data import store
    buf = io.BytesIO()
    with tempfile.TemporaryDirectory(prefix="porter-export-") as tmp, \
            zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        try:
            for p in export(store(url), job_id, fmt, Path(tmp)):
                z.write(p, p.relative_to(tmp).as_posix())
        except PorterError as e:
            z.writestr("ERROR.txt", f"porter export {job_id} --format {fmt}: {e}\n")
    data = buf.getvalue()
    with _lock:
        _cache[key] = data
    return data
