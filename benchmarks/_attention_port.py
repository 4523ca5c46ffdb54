"""benchmarks/attention.py's engine half: porter's own job loop (porter.job.loop.run_job with
the GPU backend) ports flash_attention_fwd at one anchor shape. The measuring child sets up the
`attention` op's inputs, its fp32 reference and the SDPA baselines, and verifies every trial
(NaN-poisoned outputs, O and LSE against fp32) before timing it; a wrong result is recorded as
`wrong_result`, never timed. The search starts from known winners (warm start), then the
template's seeds, then porter's default proposer."""
from __future__ import annotations

import json
import time
from pathlib import Path

FAILED = ("wrong_result", "crashed", "launch_failed", "timeout")


def size_text(shape) -> str:
    B, H, HKV, S, D, causal = shape
    return f"{B}x{H}x{HKV}x{S}x{D}x{2 if causal else 1}"


def known_winners(path: Path) -> list[tuple[dict, dict]]:
    """(shape, params) of the records of an earlier results file (empty if there is none)."""
    if not path.is_file():
        return []
    return [(r["shape"], r["params"]) for r in json.loads(path.read_text()).get("records", [])]


def warm_configs(tpl, shape, known) -> list[dict]:
    """Whole configurations from earlier winners: this shape's first, then the others with its
    head dim (every parameter a winner leaves out takes the template's default)."""
    B, H, HKV, S, D, causal = shape
    default = {n: v[0] for n, v in tpl.params.items()}
    mine, others = [], []
    for s, params in known:
        if params.get("HD", s.get("D")) != D:
            continue
        cfg = {**default, "CAUSAL_SKIP": 1, **params, "HD": D}
        same = (s["B"], s["H"], s.get("HKV", s["H"]), s["S"], s["D"], s["causal"]) == \
            (B, H, HKV, S, D, causal)
        (mine if same else others).append(cfg)
    out = []
    for cfg in mine + others:
        if cfg not in out:
            out.append(cfg)
    return out


def port_shape(store, backend, shape, trials: int, minutes: float | None, workers: int,
               warm: list[dict], seed: int = 0) -> dict:
    """One engine port at `shape`; returns its job, wall seconds, counts, the best measured
    trial and every trial (params, status, figures, error against fp32)."""
    from porter.job.jobs import make_spec, template_record, template_snapshot
    from porter.job.loop import run_job
    spec, tpl, arch = make_spec("flash_attention_fwd", "sm_90a", [size_text(shape)], trials,
                                minutes, sampler="auto", seed=seed)
    src, space = template_record(tpl)
    job = store.create_job(spec, tpl.name, tpl.source_hash, src, space, status="running",
                           snapshot=template_snapshot(tpl))
    t0 = time.monotonic()
    summary = run_job(store, job, spec, tpl, arch, backend, compile_workers=workers,
                      warm_start=warm)
    seconds = time.monotonic() - t0
    rows = [_trial_row(t) for t in store.trials(job)]
    measured = [r for r in rows if r["status"] == "measured"]
    best = min(measured, key=lambda r: r["ours_ms"], default=None)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    errors = [r["error"] for r in measured if r["error"] is not None]
    return dict(job=job, status=summary.status, message=summary.message, seconds=seconds,
                counts=counts, trials=len(rows), measured=len(measured),
                failed=sum(counts.get(s, 0) for s in FAILED),
                max_error=max(errors, default=None), warm=len(warm), best=best, rows=rows)


def _trial_row(t) -> dict:
    m = t.measurements[0] if t.measurements else None
    return dict(trial=t.number, status=t.status, params=dict(t.params),
                ours_ms=m.ours_ms if m else None, baseline=m.baseline if m else None,
                baseline_ms=m.baseline_ms if m else None, ratio=m.ratio if m else None,
                tflops=m.tflops if m else None, error=m.error if m else None,
                registers=t.registers, compile_s=t.compile_seconds,
                message=(t.message or "")[:160])


def print_port(shape, p: dict) -> None:
    b = p["best"]
    head = (f"port {size_text(shape)}: job {p['job']} {p['status']} in {p['seconds']:.1f} s, "
            f"{p['trials']} trials {p['counts']}, max error {p['max_error'] or 0:.2e}")
    if b is None:
        print(head + ": nothing measured", flush=True)
        return
    print(head + f"; best trial {b['trial']} {b['ours_ms']:.4f} ms ({b['tflops']:.0f} TF/s), "
          f"{b['ratio'] or 0:.3f}x {b['baseline']}: "
          + " ".join(f"{k}={v}" for k, v in b["params"].items()), flush=True)
