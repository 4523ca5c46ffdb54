"""Compile template variants to cubin with NVRTC (from PyPI; no CUDA toolkit needed).

Each variant is compiled with its parameters as -D defines. ptxas's verbose report is parsed for
registers, shared memory, spills and stack frame. Results are cached on disk, keyed by the
source, options, architecture and NVRTC version.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from porter.spec.arch import Arch
from porter.spec.template import INCLUDE_DIR, Template

BASE_OPTIONS = ("-std=c++17", "--no-source-include", "--ptxas-options=-v", "-default-device",
                "--use_fast_math")


@dataclass(frozen=True)
class Resources:
    registers: int = 0
    smem_static: int = 0       # bytes of static shared memory (dynamic comes from the launch)
    spill_stores: int = 0
    spill_loads: int = 0
    stack_frame: int = 0
    cmem: int = 0


@dataclass
class CompileResult:
    ok: bool
    key: str
    log: str = ""
    seconds: float = 0.0
    resources: Resources = field(default_factory=Resources)
    cubin_path: str | None = None
    cached: bool = False

    def to_dict(self) -> dict:
        d = asdict(self)
        return d


def nvrtc_version() -> str:
    from cuda.bindings import nvrtc
    _, major, minor = nvrtc.nvrtcVersion()
    return f"{major}.{minor}"


def cache_dir() -> Path:
    d = Path(os.environ.get("PORTER_CACHE_DIR", Path.home() / ".cache" / "kernel-porter"))
    d.mkdir(parents=True, exist_ok=True)
    return d


@functools.lru_cache(maxsize=64)
def _include_digest(folder: Path, stamp: float) -> str:
    h = hashlib.sha256()
    for p in sorted(folder.rglob("*")):
        if p.suffix in (".cuh", ".h") and p.is_file():
            h.update(p.relative_to(folder).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def include_dir(template: Template) -> Path:
    """The headers a template compiles against: its snapshot's own, else porter's."""
    return template.include_dir or INCLUDE_DIR


def options_for(template: Template, config, arch: Arch) -> list[str]:
    return [*BASE_OPTIONS, f"--gpu-architecture={arch.name}", f"-I{include_dir(template)}",
            *template.options, *template.defines(config, arch)]


def variant_key(template: Template, config, arch: Arch) -> str:
    """Same source, headers, options and compiler: same key (wherever the headers lie)."""
    inc = include_dir(template)
    stamp = max((p.stat().st_mtime for p in inc.rglob("*") if p.is_file()), default=0.0)
    opts = [o for o in options_for(template, config, arch) if not o.startswith("-I")]
    h = hashlib.sha256()
    for part in (template.source, template.kernel, arch.name, nvrtc_version(),
                 _include_digest(inc, stamp), json.dumps(opts)):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:32]


_RES = {
    "registers": re.compile(r"Used (\d+) registers"),
    "smem_static": re.compile(r"(\d+) bytes smem"),
    "cmem": re.compile(r"(\d+) bytes cmem\[0\]"),
    "stack_frame": re.compile(r"(\d+) bytes stack frame"),
    "spill_stores": re.compile(r"(\d+) bytes spill stores"),
    "spill_loads": re.compile(r"(\d+) bytes spill loads"),
}


def parse_resources(log: str, kernel: str) -> Resources:
    """Reads ptxas -v output for the named kernel (the log can describe several functions)."""
    section = log
    m = re.search(r"Compiling entry function '[^']*%s[^']*'" % re.escape(kernel), log)
    if m:
        section = log[m.start():]
        nxt = section.find("Compiling entry function", 10)
        section = section if nxt < 0 else section[:nxt]
    vals = {}
    for k, rx in _RES.items():
        found = rx.search(section)
        vals[k] = int(found.group(1)) if found else 0
    return Resources(**vals)


def binary_resources(cubin: bytes, log: str, kernel: str) -> Resources:
    """Registers, static shared memory and stack frame from the cubin itself (the same on every
    NVRTC build); spill counts from ptxas' report where the log has one, else the stack frame
    (the local memory the function uses, spills included) stands in for them."""
    from porter.build.cubin import read_resources
    logged = parse_resources(log, kernel)
    elf = read_resources(cubin, kernel)
    if elf is None:
        return logged
    reported = logged.registers > 0          # the log carried ptxas' resource lines
    return Resources(registers=elf.registers, smem_static=elf.smem_static,
                     spill_stores=logged.spill_stores if reported else elf.stack_frame,
                     spill_loads=logged.spill_loads if reported else elf.stack_frame,
                     stack_frame=elf.stack_frame, cmem=elf.cmem or logged.cmem)


def _nvrtc_compile(source: str, name: str, options: list[str], output: str = "cubin"
                   ) -> tuple[bool, str, bytes]:
    """(ok, log, the cubin or, with output="ptx", the PTX); never raises for a compile error."""
    from cuda.bindings import nvrtc
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        return False, f"nvrtcCreateProgram: {err}", b""
    try:
        opts = [o.encode() for o in options]
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        # NVRTC writes into the buffers it is given: mutable ones. (b" " * n was one byte for an
        # empty log, CPython's shared b" " object: NVRTC's terminating zero turned every b" " of
        # the process into b"\0".)
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = bytearray(n)
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = bytes(buf).rstrip(b"\0 ").decode(errors="replace")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            return False, log, b""
        size, get = ((nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX) if output == "ptx" else
                     (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN))
        _, n = size(prog)
        out = bytearray(n)
        get(prog, out)
        return True, log, bytes(out)
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def compile_variant(template: Template, config, arch: Arch, use_cache: bool = True
                    ) -> CompileResult:
    """Compiles one configuration; never raises for a compiler failure (ok=False, log kept)."""
    key = variant_key(template, config, arch)
    root = cache_dir()
    cubin_path = root / f"{key}.cubin"
    meta_path = root / f"{key}.json"
    if use_cache and meta_path.is_file():
        try:
            meta = json.loads(meta_path.read_text())
            if not meta["ok"] or cubin_path.is_file():
                meta["resources"] = Resources(**meta["resources"])
                meta["cached"] = True
                meta["cubin_path"] = str(cubin_path) if meta["ok"] else None
                return CompileResult(**meta)
        except (ValueError, KeyError, TypeError):
            pass  # a damaged cache entry is recompiled
    t0 = time.perf_counter()
    ok, log, cubin = _nvrtc_compile(template.source, f"{template.name}.cu",
                                    options_for(template, config, arch))
    seconds = time.perf_counter() - t0
    res = binary_resources(cubin, log, template.kernel) if ok else Resources()
    result = CompileResult(ok=ok, key=key, log=log, seconds=seconds, resources=res,
                           cubin_path=str(cubin_path) if ok else None)
    if ok:
        tmp = cubin_path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_bytes(cubin)
        os.replace(tmp, cubin_path)
    tmp = meta_path.with_suffix(f".{os.getpid()}.tmp")
    d = result.to_dict()
    d.pop("cached", None)
    tmp.write_text(json.dumps(d))
    os.replace(tmp, meta_path)
    return result


def compile_ptx(template: Template, config, arch: Arch) -> tuple[bool, str, str]:
    """PTX for export (cubins are what workers ship; PTX needs a driver at least as new)."""
    opts = [o for o in options_for(template, config, arch) if not o.startswith("--ptxas")]
    ok, log, ptx = _nvrtc_compile(template.source, "k.cu", opts, output="ptx")
    return ok, log, ptx.rstrip(b"\0").decode() if ok else ""
