"""The replay backend: serves timings recorded from real GPU runs instead of a GPU.

Every row it produces is labelled `replay`. Sources: porter's own recordings (exported from the
database by `porter record JOB`) and Kernel Tuner cache files (.json or .json.gz).
"""
from __future__ import annotations

import gzip
import json
import time
from pathlib import Path

from porter.errors import SpecError
from porter.records import Measurement
from porter.measure.backends.base import Backend, Outcome

RECORDING_FORMAT = "porter-recording/1"
_KT_FAILURES = {"InvalidConfig": "infeasible", "CompilationFailedConfig": "compile_failed",
                "RuntimeFailedConfig": "launch_failed"}


def read_json(path: str | Path):
    p = Path(path)
    opener = gzip.open if p.suffix == ".gz" else open
    with opener(p, "rt") as f:
        return json.load(f)


class ReplayBackend(Backend):
    name = "replay"
    needs_compile = False

    def __init__(self, source: str | Path, hold: bool = False, compile: bool = False):
        """hold: sleep for each trial's recorded GPU time, so a replayed worker is as busy as
        the real one was. compile: still compile variants (for tests of the compile path)."""
        try:
            data = read_json(source)
        except (OSError, ValueError) as e:
            raise SpecError(f"cannot read replay source {source}: {e}") from None
        self.source = str(source)
        self.hold = hold
        self.needs_compile = compile
        if isinstance(data, dict) and data.get("format") == RECORDING_FORMAT:
            self.kind = "porter"
            self.device = dict(data.get("device", {}))
            self.entries = data["trials"]
            self.params = tuple(data.get("param_names", ()))
            # optional: the vendor baselines' kernel names by size ("MxNxK": [...]), as the
            # GPU backend's profiler read them (vendor_kernels)
            vendor = data.get("vendor_kernels", {})
            if not isinstance(vendor, dict) or not all(
                    isinstance(v, list) and all(isinstance(k, str) for k in v)
                    for v in vendor.values()):
                raise SpecError(f"{source}: vendor_kernels must map sizes (\"MxNxK\") to lists "
                                "of kernel names")
            self.vendor = {str(k): list(v) for k, v in vendor.items()}
        elif isinstance(data, dict) and "cache" in data and "tune_params_keys" in data:
            self.kind = "kt"
            self.device = {"gpu": data.get("device_name", "")}
            self.params = tuple(data["tune_params_keys"])
            self.problem_size = tuple(data.get("problem_size") or ())
            self.entries = data["cache"]
            self.tune_params = data["tune_params"]
            self.vendor = {}
        else:
            raise SpecError(f"{source} is neither a porter recording nor a Kernel Tuner cache")
        self.device["replay_source"] = Path(source).name

    def device_info(self) -> dict:
        return dict(self.device, backend="replay")

    def vendor_kernels(self, template, sizes) -> list[list[str]]:
        return [list(self.vendor.get("x".join(map(str, s)), ())) for s in sizes]

    def key(self, config: dict) -> str:
        names = self.params or tuple(config)
        return ",".join(str(config[n]) for n in names)

    def allows(self, config: dict) -> bool:
        return self.key(config) in self.entries

    def measure(self, template, arch, config, compiled, sizes) -> Outcome:
        entry = self.entries.get(self.key(config))
        dev = self.device_info()
        if entry is None:
            return Outcome("infeasible", "replay: configuration not in the recording", (), dev)
        if self.kind == "kt":
            t = entry.get("time")
            if isinstance(t, str) or t is None:
                return Outcome(_KT_FAILURES.get(str(t), "launch_failed"), f"replay: {t}", (),
                               dev)
            if t >= 1e20:
                return Outcome("launch_failed", "replay: recorded as failed", (), dev)
            if self.hold:
                time.sleep(sum(entry.get("times", [t])) / 1e3)
            size = tuple(sizes[0]) if sizes else self.problem_size
            return Outcome("measured", "replay", (Measurement(size=size, ours_ms=float(t)),),
                           dev)
        ms = tuple(Measurement(**dict(m, size=tuple(m["size"])))
                   for m in entry.get("measurements", ()))
        if sizes:
            wanted = {tuple(s) for s in sizes}
            ms = tuple(m for m in ms if m.size in wanted)
            if entry["status"] == "measured" and len(ms) < len(wanted):
                return Outcome("infeasible", "replay: size not in the recording", (), dev)
        if self.hold:
            time.sleep(float(entry.get("gpu_s", 0.0)))
        return Outcome(entry["status"], ("replay: " + entry.get("message", "")).strip(), ms,
                       dict(dev, **entry.get("device", {}), backend="replay"))


def recording(template_name: str, arch: str, param_names, device: dict, trials) -> dict:
    """Builds a porter recording from TrialRecords (what `porter record` writes). An entry of
    a trial that reused another job's measurement (porter.job.cache) says which:
    `reused_from: [job, trial number]` of the trial that measured it; replay ignores it."""
    out = {}
    for t in trials:
        if t.status in ("infeasible",):
            continue
        gpu_s = sum(m.ours_ms for m in t.measurements) * 0.05  # ~50 timed repeats
        out[t.config_key] = {
            "status": t.status, "message": t.message, "gpu_s": gpu_s,
            "measurements": [
                {k: (list(v) if k == "size" else v) for k, v in m.__dict__.items()}
                for m in t.measurements],
            "device": t.device,
        }
        if t.reused_from is not None:
            out[t.config_key]["reused_from"] = [int(x) for x in t.reused_from]
    return {"format": RECORDING_FORMAT, "template": template_name, "arch": arch,
            "param_names": list(param_names), "device": device, "trials": out}
