"""The measuring child process. Protocol over a Pipe: the parent sends a job dict per trial (None
to stop); the child answers {status, message, measurements, device, restart}. After a sticky CUDA
error (illegal address and the like) the child answers and asks to be restarted."""
from __future__ import annotations

import ctypes
import datetime
import statistics
import subprocess
import threading
import time

from porter.measure.backends.gpu import STICKY

L2_FLUSH_BYTES = 256 << 20


class DeviceSampler(threading.Thread):
    """Clocks, temperature and power, sampled every second by nvidia-smi where it exists."""

    FIELDS = ("clocks.sm", "clocks.mem", "temperature.gpu", "power.draw")

    def __init__(self):
        super().__init__(daemon=True)
        self.latest: dict = {}

    def sample(self) -> dict:
        try:
            out = subprocess.run(
                ["nvidia-smi", f"--query-gpu={','.join(self.FIELDS)}",
                 "--format=csv,noheader,nounits", "-i", "0"],
                capture_output=True, text=True, timeout=5).stdout.strip().splitlines()[0]
            vals = [v.strip() for v in out.split(",")]
            return {"sm_clock_mhz": vals[0], "mem_clock_mhz": vals[1], "temp_c": vals[2],
                    "power_w": vals[3]}
        except Exception:
            return {}

    def run(self):
        while True:
            self.latest = self.sample()
            time.sleep(1.0)


def _device_info(cp) -> dict:
    props = cp.cuda.runtime.getDeviceProperties(0)
    info = {
        "gpu": props["name"].decode() if isinstance(props["name"], bytes) else props["name"],
        "cc": f"{props['major']}.{props['minor']}",
        "sms": props["multiProcessorCount"],
        "l2_bytes": props["l2CacheSize"],
        "cuda_runtime": cp.cuda.runtime.runtimeGetVersion(),
        "cuda_driver": cp.cuda.runtime.driverGetVersion(),
        "cupy": cp.__version__,
    }
    try:
        info["driver"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader", "-i", "0"],
            capture_output=True, text=True, timeout=5).stdout.strip()
    except Exception:
        info["driver"] = ""
    return info


def _np_args(args):
    import numpy as np
    conv = {ctypes.c_void_p: np.uint64, ctypes.c_int: np.int32, ctypes.c_float: np.float32,
            ctypes.c_longlong: np.int64, ctypes.c_uint: np.uint32, ctypes.c_double: np.float64}
    out = []
    for a in args:
        if isinstance(a, ctypes.c_void_p):
            out.append(np.uint64(a.value or 0))
        else:
            out.append(conv[type(a)](a.value))
    return out


class Child:
    def __init__(self, opts):
        import cupy as cp
        self.cp = cp
        self.opts = opts
        self.modules: dict = {}
        self.ops: dict = {}
        self.states: dict = {}          # (op, size) -> op state
        self.baseline: dict = {}        # (op, size) -> (name, median ms)
        self.flush = cp.empty(L2_FLUSH_BYTES // 4, dtype=cp.int32)
        self.sampler = DeviceSampler()
        self.sampler.start()
        self.device = _device_info(cp)
        self.busy_ms = 0.0

    # ---- timing -------------------------------------------------------------------------
    def time_fn(self, fn) -> list[float]:
        return self.time_interleaved([fn])[0]

    def time_interleaved(self, fns) -> list[list[float]]:
        """Several functions timed in turn inside every repeat (each after an L2 flush, the
        order rotating from repeat to repeat), so clock and power changes during the run fall on
        all of them alike: the fair way to take a ratio on a power-limited GPU."""
        cp = self.cp
        est = []
        for fn in fns:
            fn()
            cp.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            cp.cuda.Device().synchronize()
            est.append(max((time.perf_counter() - t0) * 1e3, 1e-3))
        reps = int(min(self.opts["max_repeats"],
                       max(self.opts["min_repeats"], self.opts["target_ms"] / sum(est))))
        n = len(fns)
        events = [[(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)] for _ in fns]
        for i in range(reps):
            for j in range(n):
                k = (i + j) % n
                self.flush.fill(i)      # evicts L2 so every repeat reads from device memory
                events[k][i][0].record()
                fns[k]()
                events[k][i][1].record()
        events[-1][-1][1].synchronize()
        cp.cuda.Device().synchronize()
        times = [[cp.cuda.get_elapsed_time(a, b) for a, b in ev] for ev in events]
        self.busy_ms += sum(map(sum, times)) + 2 * sum(est)
        return times

    def state(self, op, size):
        key = (op.name, tuple(size))
        if key not in self.states:
            # one size at a time on the device keeps memory small
            self.states = {k: v for k, v in self.states.items() if k[0] == op.name}
            if len(self.states) >= 4:
                self.states.pop(next(iter(self.states)))
            self.states[key] = op.setup(tuple(size), self.opts["seed"] + len(self.baseline))
        return self.states[key]

    def baseline_ms(self, op, size, state):
        key = (op.name, tuple(size))
        if key not in self.baseline:
            best = None
            for name, fn in op.baselines(state).items():
                ms = statistics.median(self.time_fn(fn))
                if best is None or ms < best[1]:
                    best = (name, ms)
            self.baseline[key] = best
        return self.baseline[key]

    # ---- one trial ------------------------------------------------------------------------
    def run(self, job, ready=lambda: None) -> dict:
        from porter.measure.ops import make_op
        cp = self.cp
        op = self.ops.get((job["op"], job.get("template_dir")))
        if op is None:
            op = make_op(job["op"], job.get("template_dir", ""),
                         bool(job.get("trust_template_code")))
            self.ops[(job["op"], job.get("template_dir"))] = op
        rtol = job["rtol"] or op.rtol
        try:
            if job["cubin"] not in self.modules:
                mod = cp.RawModule(path=job["cubin"])
                self.modules[job["cubin"]] = (mod, mod.get_function(job["kernel"]))
            mod, func = self.modules[job["cubin"]]
        except Exception as e:  # noqa: BLE001 - any load failure is this variant's
            return {"status": "launch_failed", "message": f"module load: {e}"}
        # inputs, reference and vendor baseline first (no template code yet); then `ready`
        # starts the parent's clock for the kernel itself
        for s in job["sizes"][:4]:
            state = self.state(op, tuple(s["size"]))
            if not job.get("fresh_baseline"):
                self.baseline_ms(op, tuple(s["size"]), state)
            else:   # timed later beside ours: warmed up here (handles, library kernels)
                for fn in op.baselines(state).values():
                    fn()
        cp.cuda.Device().synchronize()
        ready()
        measurements = []
        for s in job["sizes"]:
            size = tuple(s["size"])
            state = self.state(op, size)
            ws = cp.zeros(max(s["workspace"], 16), dtype=cp.uint8)
            args = op.args(state, ws.data.ptr)
            for name, arr in op.constants(state).items():
                sym = mod.get_global(name)
                cp.cuda.runtime.memcpy(sym.ptr, arr.data.ptr, arr.nbytes,
                                       cp.cuda.runtime.memcpyDeviceToDevice)
            launch = self._launcher(func, s, state, args, op)
            if isinstance(launch, str):
                return {"status": "launch_failed", "message": launch}
            op.poison(state)
            try:
                launch()
                cp.cuda.Device().synchronize()
            except Exception as e:  # noqa: BLE001
                msg = str(e)
                sticky = any(w in msg.lower() for w in STICKY)
                return {"status": "crashed" if sticky else "launch_failed",
                        "message": f"size {'x'.join(map(str, size))}: {msg}",
                        "restart": sticky}
            err = op.error(state)
            if not err <= rtol:
                return {"status": "wrong_result", "message": f"size {'x'.join(map(str, size))}"
                        f": relative error {err:.3g} > {rtol:g}"}
            clean = s.get("workspace_clean", s["workspace"])
            if clean and bool(ws[:clean].any()):
                return {"status": "wrong_result", "message": "the kernel left its workspace "
                        "dirty (it must leave it zeroed)"}
            if job.get("fresh_baseline"):
                # ours and every baseline interleaved repeat by repeat (side-by-side figures)
                bases = op.baselines(state)
                all_times = self.time_interleaved([launch, *bases.values()])
                times = all_times[0]
                meds = {name: statistics.median(t) for name, t in zip(bases, all_times[1:])}
                base_name = min(meds, key=meds.get) if meds else ""
                base_ms = meds.get(base_name)
            else:
                base = self.baseline_ms(op, size, state)
                base_name, base_ms = base if base else ("", None)
                times = self.time_fn(launch)
            ms = statistics.median(times)
            q = statistics.quantiles(times, n=10) if len(times) >= 10 else [ms, ms]
            measurements.append({
                "size": size, "ours_ms": ms, "ours_spread": (q[-1] - q[0]) / ms,
                "baseline": base_name, "baseline_ms": base_ms,
                "ratio": base_ms / ms if base_ms else None,
                "error": err,
                "tflops": s["flops"] / ms / 1e9 if s["flops"] else None,
                "gbps": s["bytes"] / ms / 1e6 if s["bytes"] else None,
            })
        device = dict(self.device, **self.sampler.latest,
                      measured_at=datetime.datetime.now(datetime.timezone.utc).isoformat())
        return {"status": "measured", "measurements": measurements, "device": device,
                "message": op.note}

    def _launcher(self, func, s, state, args, op):
        grid, block, smem = tuple(s["grid"]), tuple(s["block"]), int(s["smem"])
        if s["tensor_maps"] or tuple(s["cluster"]) != (1, 1, 1):
            import porter.measure.tma as tma
            blobs = []
            # an op that builds whole maps (any rank: attention's {D, S, B * heads}) is asked
            # for each; the others describe a 2-D buffer (`op.buffer`) encoded here
            op_map = getattr(op, "tensor_map", None)
            for buf, box, swizzle in s["tensor_maps"]:
                if not all(box):   # a zero extent: this configuration does not use the map
                    blobs.append(bytes(128))
                    continue
                if callable(op_map):
                    try:
                        blobs.append(op_map(state, buf, tuple(box), swizzle))
                    except Exception as e:  # noqa: BLE001 - a map the driver refuses
                        return f"tensor map over {buf} (box {tuple(box)}): {e}"
                    continue
                ptr, rows, cols, stride = op.buffer(state, buf)
                blobs.append(tma.encode_tiled_2d(ptr, rows, cols, stride, box[0], box[1],
                                                 swizzle))
            full = list(args) + blobs
            from cuda.bindings import driver
            handle = driver.CUfunction(func.kernel.ptr if hasattr(func, "kernel") else func.ptr)
            cluster = tuple(s["cluster"])
            return lambda: tma.launch(handle, grid, block, smem, cluster, full)
        try:
            if smem > 48 * 1024:
                func.max_dynamic_shared_size_bytes = smem
        except Exception as e:  # noqa: BLE001
            return f"cannot set {smem} bytes of dynamic shared memory: {e}"
        np_args = tuple(_np_args(args))
        return lambda: func(grid, block, np_args, shared_mem=smem)


def kernel_names(fn, sync) -> list[str]:
    """Names of the CUDA kernels one call of fn launches, after a warm-up call (torch's
    profiler; its CUDA activity covers every kernel of the process, CuPy's cuBLAS calls too)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return [e.name for e in prof.events() if e.device_type.name == "CUDA"]


def vendor_kernels(job) -> dict:
    """GpuBackend.vendor_kernels' process: for each of the job's sizes, the kernels each
    baseline of the op launches there, the fastest baseline's first (each timed alone)."""
    try:
        import torch  # noqa: F401 - the profiler is torch's
    except ImportError:
        return {"kernels": [], "message": "torch is not installed beside the GPU: the vendor's "
                "kernel names are unknown"}
    import cupy as cp
    from porter.measure.ops import make_op
    op = make_op(job["op"], job.get("template_dir", ""), bool(job.get("trust_template_code")))

    def sync():
        cp.cuda.Device().synchronize()
        torch.cuda.synchronize()

    def median_ms(fn, reps=10):
        fn()
        sync()
        ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(reps)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        sync()
        return statistics.median(cp.cuda.get_elapsed_time(a, b) for a, b in ev)
    out = []
    for size in job["sizes"]:
        state = op.setup(tuple(size), int(job.get("seed", 0)))
        bases = op.baselines(state)
        names: list[str] = []
        for n in sorted(bases, key=lambda n: median_ms(bases[n])):
            names += [k for k in kernel_names(bases[n], sync) if k not in names]
        out.append(names)
        del state, bases
    return {"kernels": out, "message": "" if any(out) else
            "the profiler saw no kernel of the baselines"}


def main(conn, opts):
    try:
        child = Child(opts)
    except Exception as e:  # noqa: BLE001
        conn.send({"device": {}, "error": str(e)})
        return
    conn.send({"device": child.device})
    while True:
        job = conn.recv()
        if job is None:
            return
        child.busy_ms = 0.0
        try:
            reply = child.run(job, lambda: conn.send({"ready": True}))
        except Exception as e:  # noqa: BLE001 - a harness failure is recorded, not fatal
            msg = str(e)
            reply = {"status": "crashed" if any(w in msg.lower() for w in STICKY)
                     else "launch_failed", "message": msg, "restart": True}
        reply.setdefault("device", child.device)
        reply["busy_ms"] = child.busy_ms
        conn.send(reply)
        if reply.get("restart"):
            return
