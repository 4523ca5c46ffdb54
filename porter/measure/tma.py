"""TMA descriptors and extended kernel launches through the CUDA driver API (cuda.bindings).

`encode_tiled_2d` builds the 128-byte CUtensorMap that a kernel takes as a
`const __grid_constant__ CUtensorMap` parameter (`encode_tiled`: any rank up to 5, e.g. the
attention op's {D, S, B * heads}); `launch` starts a kernel with cuLaunchKernelEx,
optionally with a thread-block cluster, after raising its dynamic shared-memory limit.

Both need a CUDA driver and a current context (CuPy's or torch's primary context will do); the
module imports nothing from CUDA until called, so it is safe to import on a machine without one.
"""
from __future__ import annotations

import ctypes
import os
import struct
from typing import Any, Sequence

TENSOR_MAP_BYTES = 128
_SWIZZLES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
L2_PROMOTIONS = ("NONE", "L2_64B", "L2_128B", "L2_256B")


class TmaError(RuntimeError):
    """A driver call failed; the message names the call and the CUresult."""


def _driver():
    from cuda.bindings import driver
    return driver


def _check(result, what: str):
    """cuda.bindings returns (CUresult, values...): raise on error, return the values."""
    drv = _driver()
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        try:
            _, name = drv.cuGetErrorName(err)
            name = name.decode() if isinstance(name, bytes) else str(name)
        except Exception:  # noqa: BLE001 - the name is only decoration
            name = str(err)
        raise TmaError(f"{what} failed: {name}")
    if isinstance(result, tuple):
        rest = result[1:]
        return rest[0] if len(rest) == 1 else (rest or None)
    return None


def encode_tiled_2d(ptr: int, rows: int, cols: int, row_stride_bytes: int, box_cols: int,
                    box_rows: int, swizzle: int = 128) -> bytes:
    """A 2-D bf16 tensor map over a row-major matrix (rows x cols, `row_stride_bytes` apart).

    Dimensions go innermost first: {cols, rows}; the box is box_cols x box_rows elements.
    Interleave none, L2 promotion by the row pitch (`l2_promotion`), out-of-bounds elements
    read as zero.
    Returns the descriptor's 128 bytes, ready to pass by value as a kernel argument.
    """
    if swizzle not in _SWIZZLES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLES)}, not {swizzle}")
    if ptr % 16 or row_stride_bytes % 16:
        raise ValueError("TMA needs a 16-byte aligned base address and row pitch "
                         f"(got address {ptr:#x}, pitch {row_stride_bytes} bytes)")
    if not (1 <= box_cols <= 256 and 1 <= box_rows <= 256):
        raise ValueError(f"TMA box extents must be in 1..256 (got {box_cols} x {box_rows})")
    if swizzle and box_cols * 2 > swizzle:
        raise ValueError(f"box inner extent {box_cols} bf16 = {box_cols * 2} bytes exceeds the "
                         f"{swizzle}-byte swizzle span")
    return encode_tiled(ptr, [cols, rows], [row_stride_bytes], [box_cols, box_rows], swizzle)


def tiled_params(ptr: int, dims: Sequence[int], strides_bytes: Sequence[int],
                 box: Sequence[int], swizzle: int = 128, elem_bytes: int = 2) -> dict:
    """The checked arguments of a rank-N tiled tensor map (N = 1..5), innermost dimension
    first: `dims` in elements, `strides_bytes` the N - 1 outer dimensions' pitches, `box` the
    tile in elements (a shorter box is padded with 1s). Raises ValueError where the driver
    would refuse (its rules for cuTensorMapEncodeTiled), so the reason reads in one line.
    Needs no driver: `encode_tiled` passes exactly these values on."""
    dims = [int(d) for d in dims]
    strides = [int(s) for s in strides_bytes]
    box = [int(b) for b in box] + [1] * (len(dims) - len(box))
    rank = len(dims)
    if not 1 <= rank <= 5 or len(strides) != rank - 1 or len(box) != rank:
        raise ValueError(f"a tensor map has rank 1..5 with rank - 1 strides and a box of at "
                         f"most rank extents (dims {dims}, strides {strides}, box {box})")
    if swizzle not in _SWIZZLES:
        raise ValueError(f"swizzle must be one of {sorted(_SWIZZLES)}, not {swizzle}")
    if ptr % 16:
        raise ValueError(f"TMA needs a 16-byte aligned base address (got {ptr:#x})")
    if not all(1 <= d <= 1 << 32 for d in dims):
        raise ValueError(f"tensor map dimensions must be in 1..2^32 (got {dims})")
    if any(s % 16 or not 0 < s < 1 << 40 for s in strides):
        raise ValueError(f"tensor map strides must be positive multiples of 16 bytes below "
                         f"2^40 (got {strides})")
    if not all(1 <= b <= 256 for b in box):
        raise ValueError(f"TMA box extents must be in 1..256 (got {box})")
    if box[0] * elem_bytes % 16:
        raise ValueError(f"the box's inner extent must be a multiple of 16 bytes (got "
                         f"{box[0]} x {elem_bytes} bytes)")
    if swizzle and box[0] * elem_bytes > swizzle:
        raise ValueError(f"box inner extent {box[0]} x {elem_bytes} bytes exceeds the "
                         f"{swizzle}-byte swizzle span")
    return {"rank": rank, "ptr": int(ptr), "dims": dims, "strides": strides, "box": box,
            "elem_strides": [1] * rank, "swizzle": swizzle}


_DTYPES = {2: "BFLOAT16", 1: "UINT8", 4: "FLOAT32"}   # by element bytes (UINT8: fp8 too)


def data_type(elem_bytes: int = 2, dtype: str | None = None) -> tuple[str, int]:
    """(CUtensorMapDataType name without its prefix, bytes per element): by `dtype` where given
    (a name of porter.export.runtime_py's TMA_DTYPES or an alias: "float16", "fp16", "bf16",
    ...), else by element size (2 bytes: BFLOAT16). ValueError (one line) for neither."""
    if dtype is not None:
        from porter.export.runtime_py import tma_dtype
        _, name, _, size = tma_dtype(dtype)
        return name, size
    if elem_bytes not in _DTYPES:
        raise ValueError(f"element size must be one of {sorted(_DTYPES)} bytes, not {elem_bytes}")
    return _DTYPES[elem_bytes], elem_bytes


def encode_tiled(ptr: int, dims: Sequence[int], strides_bytes: Sequence[int],
                 box: Sequence[int], swizzle: int = 128, elem_bytes: int = 2,
                 dtype: str | None = None) -> bytes:
    """A rank-N tensor map (arguments as `tiled_params`) of bf16 elements, or with elem_bytes
    1 of bytes (fp8: TMA only copies them) or 4 of fp32, or of the element type `dtype` names
    (it sets the size too: "float16" is FLOAT16, 2 bytes); interleave none, L2 promotion by the
    row pitch (`l2_promotion`), out-of-bounds elements read as zero and stores clip at the edges. Returns
    the descriptor's 128 bytes. `encode_tiled_2d` is the row-major bf16 matrix case."""
    type_name, elem_bytes = data_type(elem_bytes, dtype)
    p = tiled_params(ptr, dims, strides_bytes, box, swizzle, elem_bytes)
    drv = _driver()
    u64, u32 = drv.cuuint64_t, drv.cuuint32_t
    tmap = _check(drv.cuTensorMapEncodeTiled(
        getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{type_name}"),
        p["rank"],
        p["ptr"],
        [u64(d) for d in p["dims"]],
        [u64(s) for s in p["strides"]],
        [u32(b) for b in p["box"]],
        [u32(e) for e in p["elem_strides"]],
        drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{_SWIZZLES[swizzle]}"),
        getattr(drv.CUtensorMapL2promotion,
                f"CU_TENSOR_MAP_L2_PROMOTION_{l2_promotion(p['strides'])}"),
        drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    ), "cuTensorMapEncodeTiled")
    words = [int(w) for w in tmap.opaque]
    blob = struct.pack(f"<{len(words)}Q", *words)
    if len(blob) != TENSOR_MAP_BYTES:
        raise TmaError(f"unexpected CUtensorMap size {len(blob)}")
    return blob


def l2_promotion(strides_bytes: Sequence[int] = ()) -> str:
    """The L2 promotion a tensor map with these outer strides asks for: by its row pitch
    (`l2_promotion_for`: none where off 32-byte sectors, else 256 bytes, as the exports do), or
    what PORTER_TMA_L2_PROMOTION names (NONE, L2_64B, L2_128B, L2_256B), a development knob for
    probes such as `benchmarks/device_runs.sh promo`. ValueError (one line) for another value."""
    from porter.export.runtime_py import l2_promotion_for
    v = os.environ.get("PORTER_TMA_L2_PROMOTION", "").strip().upper()
    if not v:
        return l2_promotion_for(strides_bytes)
    if v not in L2_PROMOTIONS:
        raise ValueError(f"PORTER_TMA_L2_PROMOTION must be one of {', '.join(L2_PROMOTIONS)}, "
                         f"not {v!r}")
    return v


def ensure_context(device: int = 0) -> None:
    """Makes the device's primary context current if no context is (torch/CuPy usually did)."""
    drv = _driver()
    _check(drv.cuInit(0), "cuInit")
    ctx = _check(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if ctx is None or int(ctx) == 0:
        dev = _check(drv.cuDeviceGet(device), "cuDeviceGet")
        ctx = _check(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
        _check(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")


def load_function(cubin: bytes, name: str):
    """(module, function) from a cubin image; keep the module alive while the function runs."""
    drv = _driver()
    ensure_context()
    mod = _check(drv.cuModuleLoadData(cubin), "cuModuleLoadData")
    func = _check(drv.cuModuleGetFunction(mod, name.encode()), f"cuModuleGetFunction({name})")
    return mod, func


def _as_ctypes(arg: Any):
    """A kernel argument as a ctypes object whose address holds its bytes."""
    if isinstance(arg, (bytes, bytearray, memoryview)):
        raw = bytes(arg)
        return (ctypes.c_ubyte * len(raw)).from_buffer_copy(raw)
    if isinstance(arg, ctypes._SimpleCData) or isinstance(arg, ctypes.Array) \
            or isinstance(arg, ctypes.Structure):
        return arg
    raise TypeError(f"kernel argument {arg!r}: pass a ctypes value (c_void_p, c_int, ...) or "
                    "a bytes blob")


_smem_set: dict[tuple[int, int], int] = {}


def launch(func, grid: Sequence[int], block: Sequence[int], smem: int = 0,
           cluster: Sequence[int] = (1, 1, 1), args: Sequence[Any] = (), stream: int = 0) -> None:
    """Launches `func` (a CUfunction) with cuLaunchKernelEx.

    args: one entry per kernel parameter, in order: a ctypes value (ctypes.c_void_p(ptr),
    ctypes.c_int(n), ...) or a bytes blob (e.g. a tensor map from encode_tiled_2d).
    """
    drv = _driver()
    grid = tuple(int(g) for g in grid) + (1,) * (3 - len(grid))
    block = tuple(int(b) for b in block) + (1,) * (3 - len(block))
    cluster = tuple(int(c) for c in cluster) + (1,) * (3 - len(cluster))
    key = (int(func), smem)
    if smem > 48 * 1024 and _smem_set.get(key[0], -1) < smem:
        _check(drv.cuFuncSetAttribute(
            func, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem),
            "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
        _smem_set[key[0]] = smem

    cfg = drv.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = block
    cfg.sharedMemBytes = int(smem)
    cfg.hStream = drv.CUstream(stream) if isinstance(stream, int) else stream
    attrs = []
    if cluster != (1, 1, 1):
        at = drv.CUlaunchAttribute()
        at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = cluster
        attrs.append(at)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)

    holders = [_as_ctypes(a) for a in args]
    ptrs = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
    _check(drv.cuLaunchKernelEx(cfg, func, ctypes.addressof(ptrs), 0), "cuLaunchKernelEx")
