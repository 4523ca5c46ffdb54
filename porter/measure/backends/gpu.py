"""The GPU backend: variants run in a child process, restarted after a crash or a hang.

CUDA is initialised only in the child (spawned, never forked), so the parent stays safe to fork
and survives whatever a kernel does. The child keeps inputs, references and baseline timings per
problem size, so the baseline is timed in the same process on the same inputs as every variant.
"""
from __future__ import annotations

import multiprocessing as mp
import time

from porter.records import Measurement
from porter.measure.backends.base import Backend, Outcome

# Setting up a trial's inputs, reference and vendor baseline (before any template code runs):
# its own, generous limit, so a cold cuBLAS or CuPy kernel cache is not charged to the kernel.
PREPARE_S = 180.0

STICKY = ("illegal", "misaligned", "out of memory", "hardware stack", "assert", "exception",
          "unspecified launch failure", "illegal instruction", "invalid program counter")


def gpu_available() -> bool:
    """True when a CUDA device is visible; checked in a child so this process never holds CUDA."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        try:
            return pool.apply_async(_probe).get(timeout=120)
        except Exception:
            return False


def local_cc() -> tuple[int, int] | None:
    d = local_device()
    return None if d is None else d[0]


def local_device() -> tuple[tuple[int, int], int] | None:
    """(compute capability, multiprocessor count) of device 0, probed in a child."""
    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        try:
            return pool.apply_async(_probe_device).get(timeout=120)
        except Exception:
            return None


def _probe_device():
    import cupy as cp
    p = cp.cuda.runtime.getDeviceProperties(0)
    return (p["major"], p["minor"]), int(p["multiProcessorCount"])


def _probe() -> bool:
    try:
        import cupy as cp
        return cp.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


class GpuBackend(Backend):
    name = "gpu"

    def __init__(self, timeout_s: float = 30.0, seed: int = 0, min_repeats: int = 10,
                 max_repeats: int = 300, target_ms: float = 80.0, sms: int = 0):
        self.timeout_s = timeout_s
        self.sms = sms
        self.opts = dict(seed=seed, min_repeats=min_repeats, max_repeats=max_repeats,
                         target_ms=target_ms)
        self._ctx = mp.get_context("spawn")
        self._proc = None
        self._conn = None
        self._device: dict = {}
        self.fresh_baseline = False   # re-time the vendor baseline next to every variant
        self.vendor_note = ""         # why vendor_kernels found none, when it did not

    # ---- child management -----------------------------------------------------------
    def _start(self):
        parent, child = self._ctx.Pipe()
        import porter.measure.backends.gpu_child as gpu_child
        self._proc = self._ctx.Process(target=gpu_child.main, args=(child, self.opts),
                                       daemon=True)
        self._proc.start()
        child.close()
        self._conn = parent
        if not self._conn.poll(180):
            self._kill()
            raise RuntimeError("the measuring process did not start within 180 s")
        hello = self._conn.recv()
        if "error" in hello:
            self._kill()
            raise RuntimeError(f"the measuring process could not use the GPU: {hello['error']}")
        self._device = hello.get("device", {})

    def _kill(self):
        if self._proc is not None:
            self._proc.kill()
            self._proc.join(10)
        self._proc = self._conn = None

    def device_info(self) -> dict:
        if self._proc is None:
            self._start()
        return dict(self._device)

    def close(self):
        if self._proc is not None and self._proc.is_alive():
            try:
                self._conn.send(None)
                self._proc.join(5)
            except (BrokenPipeError, OSError):
                pass
        self._kill()

    def _receive(self, timeout: float):
        """The child's next message; None after `timeout` s (the child is killed), or
        {"crashed_exit": code} when it died."""
        if not self._conn.poll(timeout):
            self._kill()
            return None
        try:
            return self._conn.recv()
        except (EOFError, OSError):
            code = self._proc.exitcode if self._proc else None
            self._kill()
            return {"crashed_exit": code}

    # ---- the vendor's kernels ----------------------------------------------------------
    def vendor_kernels(self, template, sizes) -> list[list[str]]:
        """The op's baselines run at each size under torch's profiler, in one process of their
        own (the measuring process never loads the profiler): the fastest baseline's kernels
        first. Nothing without torch on the machine or when the profiler fails; `vendor_note`
        then says why."""
        sizes = [tuple(s) for s in sizes]
        job = {"op": template.op, "template_dir": str(template.folder), "sizes": sizes,
               "seed": self.opts["seed"],
               "trust_template_code": getattr(self, "trust_template_code", False)}
        import porter.measure.backends.gpu_child as gpu_child
        with self._ctx.Pool(1) as pool:
            try:
                reply = pool.apply_async(gpu_child.vendor_kernels, (job,)).get(
                    PREPARE_S * max(1, len(sizes)))
            except Exception as e:  # noqa: BLE001 - no names is one seed fewer, not a failure
                reply = {"kernels": [], "message": "profiling the baselines: "
                         f"{e or type(e).__name__}"}
        self.vendor_note = reply.get("message", "")
        got = [list(k) for k in reply.get("kernels", ())]
        return got + [[] for _ in sizes[len(got):]]

    # ---- one trial --------------------------------------------------------------------
    def measure(self, template, arch, config, compiled, sizes) -> Outcome:
        if self._proc is None or not self._proc.is_alive():
            self._start()
        job = {
            "cubin": compiled.cubin_path, "kernel": template.kernel, "op": template.op,
            "template_dir": str(template.folder),
            "rtol": template.rtol, "sizes": [], "fresh_baseline": self.fresh_baseline,
            "trust_template_code": getattr(self, "trust_template_code", False),
        }
        for size in sizes:
            launch = template.launch(config, arch, size)
            env = template.env(config, arch, size)
            job["sizes"].append({
                "size": tuple(size), "grid": launch.grid, "block": launch.block,
                "smem": launch.smem, "cluster": launch.cluster,
                "workspace": template.workspace_bytes(config, arch, size),
                "workspace_clean": template.workspace_clean_bytes(config, arch, size),
                "flops": template.metric("flops", config, arch, size),
                "bytes": template.metric("bytes", config, arch, size),
                "tensor_maps": template.map_boxes(env),
            })
        try:
            self._conn.send(job)
        except (BrokenPipeError, OSError):
            self._kill()
            return Outcome("crashed", "the measuring process had died; restarted")
        # The child first sets up the inputs, the reference and the vendor baseline (no code of
        # the template runs yet; a cold machine can take many seconds here) and says "ready";
        # the trial's own deadline starts there.
        reply = self._receive(PREPARE_S)
        if reply is None:
            return Outcome("timeout", f"the inputs and the baseline were not ready within "
                           f"{PREPARE_S:.0f} s; the measuring process was killed and restarted",
                           device=self._device)
        if reply.get("ready"):
            deadline = self.timeout_s * max(1, len(sizes))
            reply = self._receive(deadline)
            if reply is None:
                return Outcome("timeout", f"no answer within {deadline:.0f} s; the measuring "
                               "process was killed and restarted", device=self._device)
        if "crashed_exit" in reply:
            return Outcome("crashed", "the kernel took its process down (exit code "
                           f"{reply['crashed_exit']})", device=self._device)
        if reply.get("restart"):
            self._kill()
        ms = tuple(Measurement(**m) for m in reply.get("measurements", ()))
        return Outcome(reply["status"], reply.get("message", ""), ms,
                       reply.get("device", self._device), reply.get("busy_ms", 0.0))
