"""The run-time half of the `python` export, copied into every exported module (lines marked
`# porter-export: drop` are left out there, so the module imports nothing of porter).

A TunedKernel holds the tuning table and the template's space (constraints, launch geometry,
workspace and tensor-map boxes as expressions) and launches through the CUDA driver API
(cuda-bindings): cubins loaded per context, TMA descriptors encoded with cuTensorMapEncodeTiled,
thread-block clusters and large dynamic shared memory through cuLaunchKernelEx. Arguments may
be torch tensors, CuPy arrays, anything with __cuda_array_interface__, or raw addresses.
Each tensor map is encoded with its buffer's element type (TMA_DTYPES: bf16 BFLOAT16, fp8 and
other bytes UINT8, ...) and strides in that type's bytes; a spec written before maps carried
their type (three entries a map) means bf16."""
import ctypes
import math
import os
import warnings
from collections import OrderedDict

from porter.spec.expr import Expr  # porter-export: drop


# a buffer's element type -> (CUtensorMapDataType, its value, bytes per element). TMA has no fp8
# type: 1-byte elements travel as UINT8 (the copy does not convert, so only the size matters
# there; the float types are named for what they are).
TMA_DTYPES = {
    "bf16": ("BFLOAT16", 9, 2), "float16": ("FLOAT16", 6, 2), "float32": ("FLOAT32", 7, 4),
    "float64": ("FLOAT64", 8, 8), "e4m3": ("UINT8", 0, 1), "e5m2": ("UINT8", 0, 1),
    "uint8": ("UINT8", 0, 1), "int8": ("UINT8", 0, 1), "uint16": ("UINT16", 1, 2),
    "int16": ("UINT16", 1, 2), "uint32": ("UINT32", 2, 4), "int32": ("INT32", 3, 4),
    "uint64": ("UINT64", 4, 8), "int64": ("INT64", 5, 8),
}
_DTYPE_ALIASES = {"bfloat16": "bf16", "fp16": "float16", "half": "float16", "fp32": "float32",
                  "float": "float32", "fp64": "float64", "double": "float64",
                  "fp8_e4m3": "e4m3", "float8_e4m3fn": "e4m3", "fp8_e5m2": "e5m2",
                  "float8_e5m2": "e5m2"}
_SWIZZLE_NAMES = {0: "NONE", 32: "32B", 64: "64B", 128: "128B"}
SECTOR = 32   # bytes: a row pitch off this multiple gets no L2 promotion (l2_promotion_for)
# what choosing a tuned size costs, in `ranked`'s units (natural log of the size ratio), for each
# buffer whose row pitch is on 32-byte sectors at one size and off them at the other: tiles
# without a cluster, the aligned sizes' answer, ran 9-30 % slower where rows are off sectors
# (gemm_wgmma at K = 1000 / 3000 / 4104; 3000x4000x4104 0.675 against 0.982 in clusters with
# the L2 promotion rule), so K = 1000 takes another K = 1000's answer over K = 1024's (porter's
# warm start weighs K's alignment too, porter/search/warm.py)
PITCH_COST = math.log(2)


def tma_dtype(dtype):
    """(canonical dtype name, CUtensorMapDataType name, its value, bytes per element) of a
    buffer's element type; ValueError (one line) for a type TMA_DTYPES does not know."""
    name = _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())
    if name not in TMA_DTYPES:
        raise ValueError(f"no TMA data type for element type {dtype!r}; known: "
                         f"{', '.join(TMA_DTYPES)}")
    return (name, *TMA_DTYPES[name])


def l2_promotion_for(strides):
    """The L2 promotion a tensor map asks for, by its outer strides in bytes: none where a row
    pitch is off 32-byte sectors (a box row then spans five sectors and two lines, and promoting
    each miss to 256 bytes costs 5-12 % at bf16 K = 1000, 3000, 4104 on an H100,
    gemm_probe_l2_promotion_h100.json), else 256 bytes (the same speed as none where aligned)."""
    return "NONE" if any(int(s) % SECTOR for s in strides) else "L2_256B"


def tiled_args(ptr, dims, box, swizzle, dtype="bf16"):
    """The arguments of cuTensorMapEncodeTiled, as plain values, for a tensor map over a dense
    buffer of `dims` (outermost first: (rows, cols) for a matrix, attention's (B * heads, S, D))
    of `dtype` elements: the data type's name and value, rank, address, dimensions innermost
    first, the outer dimensions' strides in bytes, the box (1 for each dimension it leaves out),
    element strides, the swizzle's name and the L2 promotion's (`l2_promotion_for`). Needs no
    driver (`_encode` passes them on)."""
    _, type_name, type_value, size = tma_dtype(dtype)
    inner = [int(d) for d in reversed(dims)]
    strides, acc = [], size
    for d in inner[:-1]:
        acc *= d
        strides.append(acc)
    box = [int(b) for b in box] + [1] * (len(inner) - len(box))
    return {"data_type": type_name, "data_type_value": type_value, "elem_bytes": size,
            "rank": len(inner), "ptr": int(ptr), "dims": inner, "strides": strides, "box": box,
            "elem_strides": [1] * len(inner), "swizzle": _SWIZZLE_NAMES[swizzle],
            "l2_promotion": l2_promotion_for(strides)}


def _drv():
    try:
        from cuda.bindings import driver
    except ImportError:
        raise ImportError("this tuned kernel launches through cuda-bindings: "
                          "pip install cuda-bindings") from None
    return driver


def _cu(result, what):
    drv = _drv()
    err = result[0] if isinstance(result, tuple) else result
    if err != drv.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err}")
    rest = result[1:] if isinstance(result, tuple) else ()
    return rest[0] if len(rest) == 1 else rest


def address(x):
    """The device address of a torch tensor, CuPy array, __cuda_array_interface__ object,
    ctypes pointer or int."""
    if isinstance(x, int):
        return x
    if hasattr(x, "data_ptr"):
        return int(x.data_ptr())
    if hasattr(x, "__cuda_array_interface__"):
        return int(x.__cuda_array_interface__["data"][0])
    if isinstance(x, ctypes.c_void_p):
        return int(x.value or 0)
    if hasattr(x, "__index__"):                  # numpy integers
        return x.__index__()
    raise TypeError(f"cannot take a device address of {type(x).__name__}")


def stream_handle(s):
    """A CUstream handle (int) from None (the default stream), an int, a torch or CuPy stream."""
    if s is None:
        return 0
    for attr in ("cuda_stream", "ptr"):
        if hasattr(s, attr):
            return int(getattr(s, attr))
    return int(s)


class TunedKernel:
    def __init__(self, spec, here):
        self.spec, self.here = spec, here
        self.name, self.kernel = spec["name"], spec["kernel"]
        self.dims, self.args = list(spec["dims"]), [tuple(a) for a in spec["args"]]
        self.table = spec["table"]
        e = spec["space"]
        self.constraints = [Expr(t) for t in e["constraints"]]
        self.grid = [Expr(t) for t in e["grid"]]
        self.block = [Expr(t) for t in e["block"]]
        self.cluster = [Expr(t) for t in e["cluster"]]
        self.smem, self.workspace = Expr(e["smem"]), Expr(e["workspace"])
        # [buffer, box, swizzle, element type]; a spec without the type (older exports): bf16
        self.maps = [(m[0], [Expr(t) for t in m[1]], m[2]) for m in e["maps"]]
        self.map_dtypes = [tma_dtype(m[3] if len(m) > 3 else "bf16")[0] for m in e["maps"]]
        self._choice, self._modules, self._ws, self._smem_set = {}, {}, {}, set()
        self._sms, self._pitches = {}, {}
        self._prepared = OrderedDict()

    # ---- choosing a configuration --------------------------------------------------------
    def env(self, entry, size):
        env = dict(self.spec["limits"])
        env.update(zip(self.dims, size))
        env.update(entry["params"])
        return env

    def why_illegal(self, entry, size):
        """None if the entry's configuration may run at `size`, else the reason."""
        env = self.env(entry, size)
        for c in self.constraints:
            try:
                ok = c(env)
            except ZeroDivisionError:
                ok = False
            if not ok:
                return f"constraint {c.text!r} fails"
        g = self.plan(entry, size)
        lim = self.spec["limits"]
        threads = g["block"][0] * g["block"][1] * g["block"][2]
        if threads > lim["arch_max_threads"] or min(g["grid"]) <= 0:
            return f"block of {threads} threads, grid {g['grid']}"
        if g["smem"] > lim["arch_smem_per_block"]:
            return f"{g['smem']} bytes of shared memory"
        if g["cluster"][0] * g["cluster"][1] * g["cluster"][2] > lim["arch_max_cluster"]:
            return f"cluster {g['cluster']}"
        return None

    def pitches(self, size):
        """Per buffer a tensor map reads or writes: whether its row pitch is on 32-byte sectors
        at `size` (`l2_promotion_for`); None where its extents do not evaluate there."""
        size = tuple(size)
        if size not in self._pitches:
            env, out = dict(zip(self.dims, size)), {}
            for (buf, _, sw), dtype in zip(self.maps, self.map_dtypes):
                if buf in out:
                    continue
                try:
                    dims = [int(Expr(str(d))(env)) for d in self.spec["buffers"][buf]]
                    out[buf] = tiled_args(0, dims, [], sw, dtype)["l2_promotion"] != "NONE"
                except Exception:  # noqa: BLE001 - extents that do not evaluate tell nothing
                    out[buf] = None
            self._pitches[size] = out
        return self._pitches[size]

    def distance(self, entry, size):
        """How far `entry`'s tuned size is from `size`: the log distance over the dimensions,
        plus PITCH_COST for each buffer whose rows are on 32-byte sectors at one and not the
        other."""
        d = sum(abs(math.log(a) - math.log(b)) for a, b in zip(entry["size"], size))
        here, there = self.pitches(size), self.pitches(entry["size"])
        return d + PITCH_COST * sum(1 for b, v in here.items()
                                    if v is not None and there.get(b) not in (None, v))

    def ranked(self, size):
        """The tuned entries, the one tuned at the nearest size (`distance`) first."""
        return sorted(self.table, key=lambda e: self.distance(e, size))

    def select(self, size):
        """The tuned entry to run at `size`: the nearest tuned size whose configuration is legal
        there (a fallback past an illegal nearer one is reported once, as a warning); raises
        ValueError when none is."""
        size = tuple(int(s) for s in size)
        if size in self._choice:
            return self._choice[size]
        if len(size) != len(self.dims) or min(size) <= 0:
            raise ValueError(f"{self.name}: size {size} needs {len(self.dims)} positive values "
                             f"({', '.join(self.dims)})")
        refused = []
        for entry in self.ranked(size):
            why = self.why_illegal(entry, size)
            if why is None:
                break
            refused.append(f"tuned for {'x'.join(map(str, entry['size']))}: {why}")
        else:
            raise ValueError(f"{self.name}: no tuned configuration is legal at "
                             f"{'x'.join(map(str, size))} ({'; '.join(refused)})")
        if refused:
            warnings.warn(f"{self.name} at {'x'.join(map(str, size))}: the nearest tuned "
                          f"configuration is illegal there ({refused[0]}); using the one tuned "
                          f"for {'x'.join(map(str, entry['size']))}", stacklevel=3)
        self._choice[size] = entry
        return entry

    def plan(self, entry, size):
        """Launch geometry, workspace bytes and tensor-map boxes of `entry` at `size`."""
        env = self.env(entry, size)
        return {"grid": [int(e(env)) for e in self.grid],
                "block": [int(e(env)) for e in self.block],
                "cluster": [int(e(env)) for e in self.cluster], "smem": int(self.smem(env)),
                "workspace": int(self.workspace(env)),
                "maps": [(b, [int(x(env)) for x in box], sw) for b, box, sw in self.maps]}

    # ---- launching -----------------------------------------------------------------------
    def _context(self):
        drv = _drv()
        ctx = _cu(drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if ctx is None or int(ctx) == 0:
            _cu(drv.cuInit(0), "cuInit")
            dev = _cu(drv.cuDeviceGet(0), "cuDeviceGet")
            ctx = _cu(drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _cu(drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        if int(ctx) not in self._sms:      # persistent grids size themselves by the device
            dev = _cu(drv.cuCtxGetDevice(), "cuCtxGetDevice")
            self._sms[int(ctx)] = _cu(drv.cuDeviceGetAttribute(
                drv.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev),
                "cuDeviceGetAttribute")
        sms = self._sms[int(ctx)]
        if sms != self.spec["limits"].get("arch_sms"):
            self.spec["limits"]["arch_sms"] = sms
            self._choice.clear()
        return int(ctx)

    def function(self, ctx, entry):
        key = (ctx, entry["file"])
        if key not in self._modules:
            drv = _drv()
            with open(os.path.join(self.here, entry["file"]), "rb") as f:
                image = f.read()
            mod = _cu(drv.cuModuleLoadData(image), f"cuModuleLoadData({entry['file']})")
            fn = _cu(drv.cuModuleGetFunction(mod, self.kernel.encode()),
                        "cuModuleGetFunction")
            self._modules[key] = (mod, fn)
        return self._modules[key][1]

    def workspace_ptr(self, ctx, stream, nbytes):
        """A zeroed workspace for this context and stream, at least nbytes; the kernel leaves
        it zeroed, so it is cleared once, when allocated."""
        drv = _drv()
        key = (ctx, stream)
        have = self._ws.get(key)
        if have is None or have[1] < nbytes:
            if have is not None:
                _cu(drv.cuCtxSynchronize(), "cuCtxSynchronize")
                _cu(drv.cuMemFree(have[0]), "cuMemFree")
            size = max(nbytes, 256)
            ptr = _cu(drv.cuMemAlloc(size), "cuMemAlloc")
            _cu(drv.cuMemsetD8(ptr, 0, size), "cuMemsetD8")
            have = self._ws[key] = (ptr, size)
        return int(have[0])

    def _encode(self, ptr, dims, box, swizzle, dtype="bf16"):
        """A tensor map of `dtype` elements over a dense buffer of `dims` (outermost first: (rows,
        cols) for a matrix, attention's (B * heads, S, D)); the box gets 1 for each dimension it
        leaves out. Out-of-bounds elements read as zero, stores clip (`tiled_args`)."""
        drv = _drv()
        u64, u32 = drv.cuuint64_t, drv.cuuint32_t
        a = tiled_args(ptr, dims, box, swizzle, dtype)
        tmap = _cu(drv.cuTensorMapEncodeTiled(
            getattr(drv.CUtensorMapDataType, f"CU_TENSOR_MAP_DATA_TYPE_{a['data_type']}"),
            a["rank"], a["ptr"], [u64(d) for d in a["dims"]], [u64(s) for s in a["strides"]],
            [u32(b) for b in a["box"]], [u32(e) for e in a["elem_strides"]],
            drv.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            getattr(drv.CUtensorMapSwizzle, f"CU_TENSOR_MAP_SWIZZLE_{a['swizzle']}"),
            getattr(drv.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{a['l2_promotion']}"),
            drv.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE),
            "cuTensorMapEncodeTiled")
        words = [int(w) for w in tmap.opaque]
        return (ctypes.c_uint64 * len(words))(*words)

    def size_of(self, values):
        """The problem size from the launch's arguments: a size argument itself, else the
        op's expression over the arguments (attention's MASK = causal + 1), else an axis of an
        argument's shape (attention's D); TypeError where that argument has no shape."""
        scalars = {n: (int if k == "int" else float)(values[n])
                   for n, k in self.args if k in ("int", "float") and n in values}
        out = []
        for d in self.dims:
            if d in values:
                out.append(int(values[d]))
            elif d in self.spec.get("size_exprs", {}):
                out.append(int(Expr(self.spec["size_exprs"][d])(scalars)))
            else:
                buf, axis = self.spec.get("size_axes", {}).get(d, (None, 0))
                if buf is None:               # gemm_fp8's ACCUM: what the problem asks for
                    raise TypeError(f"{self.name}.launch cannot tell {d} from its arguments (no "
                                    f"argument gives it); pass size=({', '.join(self.dims)})")
                shape = getattr(values.get(buf), "shape", None)
                if shape is None:
                    raise TypeError(f"{self.name}.launch cannot tell {d} from its arguments "
                                    f"(raw addresses); pass size=({', '.join(self.dims)})")
                out.append(int(shape[axis]))
        return tuple(out)

    def launch(self, *args, size=None, stream=None):
        """Runs the kernel on the op's arguments (docs/TEMPLATES.md's order, without the
        workspace) on `stream`; `size` defaults to what the arguments say (`size_of`). Returns the
        table entry it ran."""
        plain = [a for a in self.args if a[1] != "workspace"]
        if len(args) != len(plain):
            raise TypeError(f"{self.name}.launch takes {len(plain)} arguments "
                            f"({', '.join(a[0] for a in plain)}), not {len(args)}")
        values = dict(zip((a[0] for a in plain), args))
        size = tuple(int(s) for s in (self.size_of(values) if size is None else size))
        entry = self.select(size)
        ctx, strm = self._context(), stream_handle(stream)
        key = (ctx, strm, id(entry), size,
               tuple(address(v) if k == "ptr" else v for (n, k), v in zip(plain, args)))
        prepared = self._prepared.get(key)
        if prepared is None:
            prepared = self._prepare(ctx, strm, entry, size, values)
            self._prepared[key] = prepared
            if len(self._prepared) > 64:
                self._prepared.popitem(last=False)
        cfg, func, ptrs, _ = prepared
        _cu(_drv().cuLaunchKernelEx(cfg, func, ctypes.addressof(ptrs), 0), "cuLaunchKernelEx")
        return entry

    def _prepare(self, ctx, strm, entry, size, values):
        drv = _drv()
        g = self.plan(entry, size)
        func = self.function(ctx, entry)
        if g["smem"] > 48 * 1024 and (int(func), g["smem"]) not in self._smem_set:
            _cu(drv.cuFuncSetAttribute(
                func, drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                g["smem"]), "cuFuncSetAttribute")
            self._smem_set.add((int(func), g["smem"]))
        holders = []
        for name, kind in self.args:
            if kind == "ptr":
                holders.append(ctypes.c_void_p(address(values[name])))
            elif kind == "int":
                holders.append(ctypes.c_int(int(values[name])))
            elif kind == "float":
                holders.append(ctypes.c_float(float(values[name])))
            else:
                holders.append(ctypes.c_void_p(self.workspace_ptr(ctx, strm, g["workspace"])))
        env = dict(zip(self.dims, size))
        for (buf, box, sw), dtype in zip(g["maps"], self.map_dtypes):
            if not all(box):          # a zero extent: this configuration does not use the map
                holders.append((ctypes.c_uint64 * 16)())
                continue
            dims = [int(Expr(str(d))(env)) for d in self.spec["buffers"][buf]]
            holders.append(self._encode(address(values[buf]), dims, box, sw, dtype))
        cfg = drv.CUlaunchConfig()
        cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = g["grid"]
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = g["block"]
        cfg.sharedMemBytes = g["smem"]
        cfg.hStream = drv.CUstream(strm)
        attrs = []
        if g["cluster"] != [1, 1, 1]:
            at = drv.CUlaunchAttribute()
            at.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = g["cluster"]
            attrs.append(at)
        cfg.attrs = attrs
        cfg.numAttrs = len(attrs)
        ptrs = (ctypes.c_void_p * max(1, len(holders)))(*[ctypes.addressof(h) for h in holders])
        return cfg, func, ptrs, holders
