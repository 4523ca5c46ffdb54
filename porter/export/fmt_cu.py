"""The `cu` format: the template's source with its tuned constants as #defines and the project's
headers inlined, one translation unit that compiles on its own with NVRTC or with nvcc
(`nvcc -arch=sm_90a -c`), plus a host launcher that computes the launch geometry at any size,
builds the TMA tensor maps (cuTensorMapEncodeTiled, reached through the runtime's driver entry
point, so nothing beyond the CUDA runtime is linked) and launches with cudaLaunchKernelExC
(thread-block clusters included). With -DPORTER_MAIN the file is a small program too
(porter/export/fmt_cu_main.py)."""
from __future__ import annotations

import re

from porter.errors import PorterError
from porter.export.cexpr import C_HELPERS, to_c
from porter.export.fmt_cu_main import main_program
from porter.export.opargs import OpArgs, map_dtypes, op_args
from porter.export.runtime_py import SECTOR
from porter.spec.arch import Arch, get_arch
from porter.spec.template import INCLUDE_DIR, Template

# features whose instructions exist only on the `a` target (not in its portable PTX)
ARCH_SPECIFIC = {"wgmma", "setmaxnreg", "tcgen05", "tmem"}
_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*"([^"]+)"[^\n]*$', re.M)
_SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}      # CUtensorMapSwizzle


def inline_headers(source: str, include_dir=None, seen: set[str] | None = None) -> str:
    """Every `#include "x"` of porter's include folder (a snapshot's own, or the project's)
    replaced by the header's text (recursively; a header already inlined, `#pragma once`, is
    not repeated)."""
    seen = set() if seen is None else seen
    include_dir = include_dir or INCLUDE_DIR

    def repl(m: re.Match) -> str:
        name = m.group(1)
        if name in seen:
            return f"// ---- {name} (inlined above) ----"
        path = include_dir / name
        if not path.is_file():
            return m.group(0)
        seen.add(name)
        text = re.sub(r"^[ \t]*#[ \t]*pragma[ \t]+once[^\n]*$", "", path.read_text(), flags=re.M)
        return f"// ---- {name} (inlined) ----\n{inline_headers(text, include_dir, seen)}\n" \
               f"// ---- end of {name} ----"
    return _INCLUDE.sub(repl, source)


def _skip(src: str, i: int) -> int:
    """Past a comment, string or character literal starting at i (else i)."""
    if src.startswith("//", i):
        j = src.find("\n", i)
        return len(src) if j < 0 else j
    if src.startswith("/*", i):
        j = src.find("*/", i + 2)
        return len(src) if j < 0 else j + 2
    if src[i] in "\"'":
        q, j = src[i], i + 1
        while j < len(src) and src[j] != q:
            j += 2 if src[j] == "\\" else 1
        return j + 1
    return i


def _match(src: str, i: int, open_: str, close: str) -> int:
    """Index just past the bracket that closes the one at i."""
    depth = 0
    while i < len(src):
        j = _skip(src, i)
        if j != i:
            i = j
            continue
        if src[i] == open_:
            depth += 1
        elif src[i] == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise PorterError("unbalanced brackets in the template source")


def guard_kernel_body(source: str, kernel: str, macro_test: str) -> str:
    """Wraps the body of `__global__ ... kernel(...)` in `#if macro_test ... #else __trap()`:
    nvcc also builds portable PTX (e.g. compute_90 beside sm_90a), where arch-specific
    instructions do not assemble; there the kernel traps instead."""
    for m in re.finditer(rf"\b{re.escape(kernel)}\s*\(", source):
        start = max(source.rfind(";", 0, m.start()), source.rfind("}", 0, m.start()))
        if "__global__" not in source[start + 1:m.start()]:
            continue
        end = _match(source, m.end() - 1, "(", ")")
        brace = end
        while brace < len(source) and source[brace] != "{":
            if source[brace] == ";":
                break
            brace = _skip(source, brace) if _skip(source, brace) != brace else brace + 1
        if brace >= len(source) or source[brace] != "{":
            continue                      # a declaration; the definition comes later
        close = _match(source, brace, "{", "}")
        body = source[brace + 1:close - 1]
        return (source[:brace + 1] + f"\n#if {macro_test}\n" + body +
                "\n#else\n  __trap();  // built for a target without this kernel's features\n"
                "#endif\n}" + source[close:])
    raise PorterError(f"the template source has no definition of __global__ {kernel}")


def standalone_source(tpl: Template, arch: str | Arch, params: dict, size=None) -> str:
    """The exported translation unit for one tuned configuration (see the module docstring);
    `size` is the problem size it was tuned for (the program's default size)."""
    a = arch if isinstance(arch, Arch) else get_arch(arch)
    arch = a.name
    cc = a.cc[0] * 10 + a.cc[1]
    src = inline_headers(tpl.source, tpl.include_dir)
    if arch.endswith("a") and ARCH_SPECIFIC & set(tpl.requires):
        src = guard_kernel_body(src, tpl.kernel, f"!defined(__CUDA_ARCH__) || defined("
                                f"__CUDA_ARCH_FEAT_SM{cc}_ALL) || defined(__CUDA_ARCH_SPECIFIC__)")
    defines = [f"#define {k} {int(v) if isinstance(v, bool) else v}" for k, v in params.items()]
    for opt in tpl.options:            # the template's own -D options
        m = re.fullmatch(r"-D([A-Za-z_]\w*)(?:=(.*))?", opt)
        if m:
            defines.append(f"#define {m.group(1)} {m.group(2) if m.group(2) is not None else 1}")
    geometry = ""
    if size:
        L = tpl.launch(params, a, tuple(size))
        geometry = (f"// tuned for {'x'.join(map(str, size))}: grid {list(L.grid)}, block "
                    f"{list(L.block)}, cluster {list(L.cluster)}, {L.smem} bytes of dynamic "
                    "shared memory\n")
    return (f"// {tpl.name} v{tpl.version} tuned by Kernel Porter for {arch} (template hash "
            f"{tpl.source_hash})\n{geometry}"
            f"// nvcc -arch={arch} -c this.cu  |  nvcc -arch={arch} -DPORTER_MAIN -o prog this.cu"
            f"\n#define PORTER_ARCH {cc}\n" + "\n".join(defines) + f"\n\n{src}\n"
            + host_code(tpl, a, params, size))


def host_code(tpl: Template, a: Arch, params: dict, size) -> str:
    """The host launcher (and PORTER_MAIN program), skipped by NVRTC and under PORTER_NO_HOST."""
    ops = op_args(tpl)
    consts = {**a.limits(), **{k: int(v) for k, v in params.items()}}
    del consts["arch_sms"]                      # the running GPU's count, asked at launch
    sizes = {n: n for n in tpl.size_names}
    if tpl.op == "kt":                          # sizes are launcher arguments of their own
        sizes = {n: f"porter_size_{n}" for n in tpl.size_names}

    def c(e) -> str:
        return to_c(e, consts, {**sizes, "arch_sms": "porter_sms()"})
    sig = [f"{x.ctype} {x.name}" for x in ops.args]
    if tpl.op == "kt":
        sig += [f"long long porter_size_{n}" for n in tpl.size_names]
    size_params = ", ".join(f"long long {v}" for v in sizes.values())
    ws = "0LL" if tpl.workspace is None else c(tpl.workspace)
    maps = _tensor_map_code(tpl, ops, c)
    n_maps = len(tpl.tensor_maps)
    argv = [f"(void*)&{x.name}" for x in ops.args] + [f"(void*)&porter_maps[{i}]"
                                                      for i in range(n_maps)]
    cluster = [c(e) for e in tpl.cluster]
    name = tpl.kernel
    launcher = f"""
#if !defined(PORTER_NO_HOST) && !defined(__CUDACC_RTC__)
#include <cuda_runtime.h>
#include <string.h>
{C_HELPERS}
// the multiprocessors of the current device (persistent grids size themselves by it)
[[maybe_unused]] static int porter_sms() {{
  int dev = 0, n = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
  return n;
}}
// Bytes of workspace launch_{name} needs at this size; pass a buffer of at least this many bytes,
// zeroed once with cudaMemset: the kernel leaves it zeroed for the next launch.
extern "C" size_t {name}_workspace_bytes({size_params}) {{
  return (size_t)({ws});
}}
{maps}
// Launches the tuned kernel on `stream` with the geometry of the space file at this size.
extern "C" cudaError_t launch_{name}({", ".join(sig)}, cudaStream_t stream) {{
  dim3 grid((unsigned)({c(tpl.grid[0])}), (unsigned)({c(tpl.grid[1])}), (unsigned)({c(tpl.grid[2])}));
  dim3 block((unsigned)({c(tpl.block[0])}), (unsigned)({c(tpl.block[1])}), (unsigned)({c(tpl.block[2])}));
  size_t smem = (size_t)({c(tpl.smem)});
  if (smem > 48 * 1024) {{
    cudaError_t e = cudaFuncSetAttribute((const void*){name},
                                         cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
    if (e != cudaSuccess) return e;
  }}
{"  CUtensorMap porter_maps[%d];" % n_maps if n_maps else ""}
{"  { cudaError_t e = porter_make_maps(porter_maps, %s); if (e != cudaSuccess) return e; }"
 % ", ".join(x.name for x in ops.args if x.kind in ("ptr", "int")) if n_maps else ""}
  void* args[] = {{{", ".join(argv)}}};
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof(cfg));
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  unsigned cx = (unsigned)({cluster[0]}), cy = (unsigned)({cluster[1]}), cz = (unsigned)({cluster[2]});
  if (cx * cy * cz > 1) {{
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = cx;
    attr[0].val.clusterDim.y = cy;
    attr[0].val.clusterDim.z = cz;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
  }}
  return cudaLaunchKernelExC(&cfg, (const void*){name}, args);
}}
"""
    return launcher + main_program(tpl, a, ops, size, sizes) + "#endif  // host code\n"


def _tensor_map_code(tpl: Template, ops: OpArgs, c) -> str:
    """porter_make_maps(maps, <pointers and sizes>): each [[tensor_maps]] entry encoded over its
    buffer (row-major, dimensions innermost first) with the buffer's element type and strides in
    its bytes (gemm_fp8's A and B: UINT8, 1 byte; bf16: BFLOAT16, 2) and the L2 promotion of
    `runtime_py.l2_promotion_for` (none where the row pitch is off 32-byte sectors, else 256
    bytes); a zero box leaves 128 zero bytes."""
    if not tpl.tensor_maps:
        return ""
    params = ", ".join(f"{'const void*' if x.kind == 'ptr' else 'int'} {x.name}"
                       for x in ops.args if x.kind in ("ptr", "int"))
    body = []
    for i, (tm, (dtype, type_name, type_value, size)) in enumerate(zip(tpl.tensor_maps,
                                                                      map_dtypes(tpl))):
        if tm.buffer not in ops.buffers:
            raise PorterError(f"tensor map over {tm.buffer!r}: op {tpl.op!r} has no such buffer")
        rows, cols = (f"(long long){d}" if not d.isdigit() else f"{d}LL"
                      for d in ops.buffers[tm.buffer])
        box = [c(e) for e in tm.box] + ["1LL"] * (2 - len(tm.box))
        unit = f"{size} byte{'s' if size > 1 else ''}"
        body.append(f"""  {{
    long long bx = {box[0]}, by = {box[1]};
    if (bx == 0 || by == 0) {{
      memset(&maps[{i}], 0, sizeof(CUtensorMap));
    }} else {{
      // {tm.buffer}: {dtype}, {unit} an element
      unsigned long long dims[2] = {{(unsigned long long){cols}, (unsigned long long){rows}}};
      unsigned long long strides[1] = {{(unsigned long long){cols} * {size}ULL}};
      unsigned box[2] = {{(unsigned)bx, (unsigned)by}}, elem[2] = {{1u, 1u}};
      int r = encode(&maps[{i}], {type_value} /* {type_name} */, 2, (void*){tm.buffer}, dims,
                     strides, box, elem, 0 /* no interleave */,
                     {_SWIZZLE[tm.swizzle]} /* swizzle {tm.swizzle} B */,
                     /* L2 promotion: none where the pitch is off 32-byte sectors, else 256 B */
                     strides[0] % {SECTOR}ULL ? 0 : 3, 0 /* out-of-bounds: zeros */);
      if (r != 0) return cudaErrorInvalidValue;
    }}
  }}""")
    return f"""
// cuTensorMapEncodeTiled through the runtime's driver entry point (no -lcuda); CUtensorMap is
// the template's own 128-byte declaration, so <cuda.h> is not included.
typedef int (*porter_encode_tiled_t)(CUtensorMap*, int, unsigned, void*, const unsigned long long*,
                                     const unsigned long long*, const unsigned*, const unsigned*,
                                     int, int, int, int);
static porter_encode_tiled_t porter_encode_tiled() {{
  static porter_encode_tiled_t fn = 0;
  if (!fn) {{
    void* p = 0;
    cudaDriverEntryPointQueryResult q;
#if CUDART_VERSION >= 12050
    cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q);
#else
    cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &p, cudaEnableDefault, &q);
#endif
    fn = (porter_encode_tiled_t)p;
  }}
  return fn;
}}
static cudaError_t porter_make_maps(CUtensorMap* maps, {params}) {{
  porter_encode_tiled_t encode = porter_encode_tiled();
  if (!encode) return cudaErrorNotSupported;
{chr(10).join(body)}
  return cudaSuccess;
}}
"""
