"""The harness of an op declared in space.toml ([op], porter.spec.opspec): inputs made from the
declared shapes and fills at each problem size, scalars from the size expressions, the
reference and baseline from trusted Python (porter.measure.ops.refs, an installed module, or
the template's own file when trusted), or, without a reference function, the output of a
named configuration of the template, which every measured row then names.

Arrays live in CuPy inside the measuring child; `xp=numpy` runs the same code on the CPU
(tests)."""
from __future__ import annotations

import ctypes

from porter.errors import TemplateError
from porter.measure.ops._bf16 import from_bf16, rel_error, to_bf16
from porter.measure.ops.base import Op
from porter.measure.ops.resolve import resolve

_CTYPES = {"int32": ctypes.c_int, "uint32": ctypes.c_uint, "int64": ctypes.c_longlong,
           "float32": ctypes.c_float, "float64": ctypes.c_double}


class DeclaredOp(Op):
    memory_bound = True

    def __init__(self, tpl, trust_template_code: bool = False, xp=None):
        spec = tpl.op_spec
        self.tpl, self.spec, self._xp_mod = tpl, spec, xp
        self.name = f"{spec.name}@{tpl.folder}"
        self.dims = tpl.size_names
        self.rtol = spec.default_rtol()
        self.signature = tuple("p" if a.is_buffer or a.workspace else "s"
                               for a in spec.kernel_args)
        folder = tpl.folder
        self.ref_fn = (resolve(spec.reference, folder, trust_template_code)
                       if spec.reference else None)
        self.base_fn = (resolve(spec.baseline, folder, trust_template_code, "baseline")
                        if spec.baseline else None)
        self.ref_config = None
        if self.ref_fn is None:
            self.ref_config = {**tpl.start_configs()[0], **(spec.reference_config or {})}
            cfg = " ".join(f"{k}={v}" for k, v in self.ref_config.items())
            self.note = (f"verified against the output of configuration {cfg} (the template "
                         "names no reference function)")

    # ---- inputs ---------------------------------------------------------------------------
    def xp(self):
        if self._xp_mod is None:
            import cupy
            self._xp_mod = cupy
        return self._xp_mod

    def _make(self, a, shape, rng):
        import numpy as np
        xp = self.xp()
        n = 1
        for s in shape:
            n *= s
        f64 = a.dtype == "float64"
        ftype = np.float64 if f64 else np.float32
        if a.fill == "normal":
            mean, std = a.fill_args
            v = rng.standard_normal(shape, dtype=ftype) * ftype(std) + ftype(mean)
        elif a.fill == "uniform":
            lo, hi = a.fill_args
            v = rng.random(shape, dtype=ftype) * ftype(hi - lo) + ftype(lo)
        elif a.fill == "index":
            v = xp.arange(n, dtype=np.float64).reshape(shape)
        else:
            v = xp.full(shape, a.fill_args[0], dtype=ftype)
        if a.dtype == "bf16":
            return to_bf16(v)
        if a.dtype.startswith(("int", "uint")) and a.fill in ("normal", "uniform"):
            v = xp.floor(v)
        return v.astype(a.storage)

    def setup(self, size, seed):
        xp = self.xp()
        env = self.tpl.size_env(size)
        rng = xp.random.default_rng(seed)
        state = {"size": tuple(size), "arrays": {}, "scalars": {}, "initial": {}, "ref": None}
        for a in self.spec.args:
            if a.workspace:
                continue
            if not a.is_buffer:
                v = a.value.walk(env)
                state["scalars"][a.name] = float(v) if a.dtype.startswith("float") else int(v)
                continue
            shape = tuple(int(e.walk(env)) for e in a.shape)
            if any(s <= 0 for s in shape):
                raise ValueError(f"argument {a.name}: shape {shape} at size {size}")
            arr = self._make(a, shape, rng)
            state["arrays"][a.name] = arr
            if a.inout:
                state["initial"][a.name] = arr.copy()
        if self.ref_fn is not None:
            state["ref"] = self._reference(state)
        else:
            state["ref"] = self._reference_by_config(state)
        return state

    def _f32(self, a, arr):
        import numpy as np
        if a.dtype == "bf16":
            return from_bf16(arr)
        if a.dtype == "float64":
            return arr
        return arr.astype(np.float32)

    def _reference(self, state):
        ins = [self._f32(a, state["initial"].get(a.name, state["arrays"][a.name]))
               for a in self.spec.args if a.is_buffer and (not a.output or a.inout)]
        out = self.ref_fn(*ins, **state["scalars"])
        return self._outputs(out, state)

    def _outputs(self, out, state):
        """A reference's result as fp32 arrays shaped like the outputs, in kernel order."""
        import numpy as np
        xp = self.xp()
        outs = self.spec.outputs
        if isinstance(out, dict):
            missing = [a.name for a in outs if a.name not in out]
            if missing:
                raise ValueError(f"the reference returned no {', '.join(missing)}")
            out = [out[a.name] for a in outs]
        elif not isinstance(out, (tuple, list)):
            out = [out]
        if len(out) != len(outs):
            raise ValueError(f"the reference returned {len(out)} outputs for {len(outs)}")
        refs = []
        for a, r in zip(outs, out):
            try:
                arr = xp.asarray(r)
            except Exception:  # noqa: BLE001 - torch tensors and other DLPack producers
                arr = xp.from_dlpack(r)
            want = state["arrays"][a.name]
            if arr.size != want.size:
                raise ValueError(f"the reference's {a.name} has {arr.size} elements, the "
                                 f"buffer {want.size}")
            refs.append(arr.reshape(want.shape).astype(np.float64 if a.dtype == "float64"
                                                       else np.float32))
        return refs

    def _reference_by_config(self, state):
        """Runs the named configuration once on these inputs; its outputs are the reference."""
        import cupy as cp
        import numpy as np
        from porter.build.compile import compile_variant
        from porter.spec.arch import arch_for_cc
        cc = cp.cuda.Device().compute_capability
        arch = arch_for_cc(int(cc[:-1]), int(cc[-1]))
        cfg, size = self.ref_config, state["size"]
        res = compile_variant(self.tpl, cfg, arch)
        if not res.ok:
            raise RuntimeError(f"the reference configuration does not compile: "
                               f"{res.log.strip()[:200]}")
        mod = cp.RawModule(path=res.cubin_path)
        fn = mod.get_function(self.tpl.kernel)
        for name, arr in self.constants(state).items():
            sym = mod.get_global(name)
            cp.cuda.runtime.memcpy(sym.ptr, arr.data.ptr, arr.nbytes,
                                   cp.cuda.runtime.memcpyDeviceToDevice)
        launch = self.tpl.launch(cfg, arch, size)
        ws = cp.zeros(max(self.tpl.workspace_bytes(cfg, arch, size), 16), dtype=cp.uint8)
        if launch.smem > 48 * 1024:
            fn.max_dynamic_shared_size_bytes = launch.smem
        conv = {ctypes.c_void_p: np.uint64, ctypes.c_int: np.int32, ctypes.c_float: np.float32,
                ctypes.c_longlong: np.int64, ctypes.c_uint: np.uint32,
                ctypes.c_double: np.float64}
        args = tuple(conv[type(a)](a.value or 0) for a in self.args(state, ws.data.ptr))
        self.poison(state)
        fn(launch.grid, launch.block, args, shared_mem=launch.smem)
        cp.cuda.Device().synchronize()
        refs = [self._f32(a, state["arrays"][a.name]).copy() for a in self.spec.outputs]
        if not all(bool(cp.isfinite(r).all()) for r in refs):
            raise RuntimeError("the reference configuration left non-finite outputs")
        return refs

    # ---- the Op interface ------------------------------------------------------------------
    def args(self, state, workspace_ptr):
        out = []
        for a in self.spec.kernel_args:
            if a.workspace:
                out.append(ctypes.c_void_p(workspace_ptr))
            elif a.is_buffer:
                out.append(ctypes.c_void_p(state["arrays"][a.name].data.ptr))
            else:
                out.append(_CTYPES[a.dtype](state["scalars"][a.name]))
        return out

    def constants(self, state):
        return {a.name: state["arrays"][a.name] for a in self.spec.args if a.symbol}

    def poison(self, state):
        for a in self.spec.outputs:
            arr = state["arrays"][a.name]
            if a.inout:
                arr[...] = state["initial"][a.name]
            elif a.dtype == "bf16":
                arr.fill(0xFFFF)
            elif a.dtype.startswith("float"):
                arr.fill(float("nan"))
            else:
                arr.fill(-1 if a.dtype.startswith("int") else 0xFF)

    def error(self, state):
        errs = [rel_error(self._f32(a, state["arrays"][a.name]), r)
                for a, r in zip(self.spec.outputs, state["ref"])]
        return max(errs, default=0.0)

    def baselines(self, state):
        if self.base_fn is None:
            return {}
        if "_baseline" not in state:
            bufs = [state["arrays"][a.name] for a in self.spec.args if a.is_buffer]
            state["_baseline"] = self.base_fn(*bufs, **state["scalars"])
        return {self.spec.baseline: state["_baseline"]}

    def buffer(self, state, name):
        arr = state["arrays"][name]
        return arr.data.ptr, arr.shape[0], arr.shape[1], arr.strides[0]

    def tensor_map(self, state, name, box, swizzle: int = 128) -> bytes:
        """The CUtensorMap over a declared buffer with its own element size (the measuring
        child calls this for every [[tensor_maps]] entry; `buffer`'s description was encoded as
        bf16 whatever the dtype): dimensions innermost first, strides from the array, the
        exports' `dtype` of the map. A box with a zero extent: 128 zero bytes (unused)."""
        if not all(box):
            return bytes(128)
        from porter.measure import tma
        arr = state["arrays"][name]
        dims = [int(d) for d in reversed(arr.shape)]
        strides = [int(s) for s in reversed(arr.strides)][1:]
        try:
            return tma.encode_tiled(arr.data.ptr, dims, strides, [int(b) for b in box], swizzle,
                                    elem_bytes=arr.dtype.itemsize)
        except (ValueError, tma.TmaError) as e:
            raise TemplateError(f"tensor map over {name} (box {tuple(box)}): {e}") from e
