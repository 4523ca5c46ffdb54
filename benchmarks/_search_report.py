"""Turns the runs of benchmarks/search_quality.py into its results file: per space and strategy
the score's mean, spread, median and 10th percentile and the evaluations to within 5% of the
optimum; auto's leave-one-space-out score; Kernel Tuner's better option set per strategy; and
the acceptance checks of issue 19."""
from __future__ import annotations

import math
import time

import numpy as np

import _search_runs as R
import _search_variants as V


def _stats(sp: R.Space, rows: list[dict]) -> dict:
    scores = [sp.score(r["traj"]) for r in rows]
    to5 = [sp.evals_to(r["traj"]) for r in rows]
    hits = sorted(x for x in to5 if x is not None)
    med = float(np.median([x if x is not None else math.inf for x in to5]))
    out = {"mean": float(np.mean(scores)), "std": float(np.std(scores)),
           "median": float(np.median(scores)), "p10": float(np.percentile(scores, 10)),
           "n": len(scores), "evals_mean": float(np.mean([r["n"] for r in rows])),
           "evals_to_5pct": {"median": med if math.isfinite(med) else None,
                             "reached": len(hits) / len(to5)},
           "seconds": round(sum(r.get("seconds", 0.0) for r in rows), 1)}
    if any("restarts" in r for r in rows):
        out["restarts_mean"] = float(np.mean([r.get("restarts", 0) for r in rows]))
    return out


def build(spaces: list[R.Space], runs: dict, args, variants: dict, failed: dict,
          method: str) -> dict:
    """runs: (space, strategy, options, seed) -> {"traj", "n", ...}; strategies "kt:NAME"
    with options "default" / "full", porter's with "default"."""
    import kernel_tuner
    result = {"method": method, "cutoff": R.CUTOFF,
              "within": R.WITHIN, "budget_cap": args.cap, "seeds": args.seeds,
              "date": time.strftime("%Y-%m-%d"), "kernel_tuner": kernel_tuner.__version__,
              "kt_full_options": {s: "options " + repr(f(1000)) + " at B = 1000, restarted "
                                  "while budget is left" for s, f in R.FULL.items()},
              "variants": variants, "failed": failed, "spaces": {}}
    grouped: dict[tuple, list] = {}
    for (sname, name, opt, seed), r in sorted(runs.items()):
        label = name + {"full": "+full", "mid": "+full+middle"}.get(opt, "")
        grouped.setdefault((sname, label), []).append(r)
    for sp in spaces:
        row = {"device": sp.cache.device, "countable": sp.n, "optimum_ms": sp.opt,
               "median_ms": sp.median, "budget_uncapped": sp.budget_uncapped,
               "budget": sp.budget, "within_5pct": sp.within,
               "random_evals_to_5pct": round(sp.random_evals_to(), 1), "scores": {}}
        for (sname, label), rows in grouped.items():
            if sname == sp.name:
                row["scores"][label] = _stats(sp, rows)
        result["spaces"][sp.name] = row
    long = [n for (_, n) in grouped if "@" in n]
    for sp in spaces:
        for n in set(long):
            rows = grouped.get((sp.name, n))
            if rows:   # beyond the budget: only when within 5% is reached, not the score
                to5 = [sp.evals_to(r["traj"]) for r in rows]
                med = float(np.median([x if x is not None else math.inf for x in to5]))
                result["spaces"][sp.name]["scores"].pop(n, None)
                result["spaces"][sp.name]["scores"]["auto"]["evals_to_5pct_" + n] = {
                    "horizon": int(np.max([r["n"] for r in rows])),
                    "median": med if math.isfinite(med) else None,
                    "reached": sum(x is not None for x in to5) / len(to5)}
    _loo(result, variants)
    _kt_better(result)
    summarise(result)
    result["table"] = table(result).splitlines()
    return result


def _mean_over(result: dict, name: str, spaces) -> float | None:
    vals = [result["spaces"][s]["scores"].get(name, {}).get("mean") for s in spaces]
    return None if any(v is None for v in vals) else float(np.mean(vals))


def _loo(result: dict, variants: dict) -> None:
    """For each space: the variant with the best mean over the other spaces, scored here."""
    names = list(result["spaces"])
    result["loo"] = {}
    for held in names:
        rest = [s for s in names if s != held]
        means = {v: _mean_over(result, V.sampler_name(v), rest) for v in variants}
        means = {v: m for v, m in means.items() if m is not None}
        if not means:
            continue
        pick = max(means, key=means.get)
        sc = result["spaces"][held]["scores"]
        if "auto" in sc:
            sc["auto"]["loo"] = dict(sc[V.sampler_name(pick)], variant=pick)
        result["loo"][held] = {"variant": pick, "mean_on_the_others": means[pick]}
    ins = {v: _mean_over(result, V.sampler_name(v), names) for v in variants}
    result["variant_means"] = {v: m for v, m in ins.items() if m is not None}


def _kt_better(result: dict) -> None:
    """Per space and Kernel Tuner strategy, the better of its default and full-budget runs
    (the better per space: generous to Kernel Tuner)."""
    for row in result["spaces"].values():
        best = {}
        for label, sc in row["scores"].items():
            if not label.startswith("kt:"):
                continue
            s, _, opt = label[3:].partition("+")
            opt = opt or "default"
            if s not in best or sc["mean"] > best[s]["mean"]:
                best[s] = {"mean": sc["mean"], "options": opt}
        row["kt_better"] = best
        row["kt_median_strategy"] = float(np.median([b["mean"] for b in best.values()])) \
            if best else None


def summarise(result: dict) -> None:
    spaces = result["spaces"]
    names = sorted({n for r in spaces.values() for n in r["scores"]})
    means = {n: m for n in names if (m := _mean_over(result, n, spaces)) is not None}
    result["mean_over_spaces"] = means          # in-sample for auto
    loo = [r["scores"].get("auto", {}).get("loo", {}).get("mean") for r in spaces.values()]
    result["loo_mean"] = float(np.mean(loo)) if loo and None not in loo else None
    kt = {}
    for n, m in means.items():
        if n.startswith("kt:"):
            s, _, opt = n[3:].partition("+")
            if s not in kt or m > kt[s]["mean"]:
                kt[s] = {"mean": m, "options": opt or "default"}
    result["kt_strategy_means"] = kt
    if not kt or "auto" not in means or result["loo_mean"] is None:
        result["goal"] = {}
        return
    best = max(kt, key=lambda s: kt[s]["mean"])
    below, below_loo, p10_neg = {}, {}, {}
    for sname, r in spaces.items():
        med = r["kt_median_strategy"]
        auto = r["scores"]["auto"]
        if auto["mean"] < med:
            below[sname] = {"auto": auto["mean"], "kt_median": med}
        if auto["loo"]["mean"] < med:
            below_loo[sname] = {"auto_loo": auto["loo"]["mean"], "kt_median": med}
        if auto["p10"] < 0 or auto["loo"]["p10"] < 0:
            p10_neg[sname] = {"p10": auto["p10"], "loo_p10": auto["loo"]["p10"]}
    g = {"loo_mean": result["loo_mean"], "auto_mean_in_sample": means["auto"],
         "best_kt": best, "best_kt_options": kt[best]["options"],
         "best_kt_mean": kt[best]["mean"],
         "loo_at_least_best_kt": result["loo_mean"] >= kt[best]["mean"],
         "spaces_below_kt_median": below, "spaces_below_kt_median_loo": below_loo,
         "spaces_with_negative_p10": p10_neg}
    g["met"] = g["loo_at_least_best_kt"] and not below and not below_loo and not p10_neg
    result["goal"] = g


def _short(s: str) -> str:
    return s.replace("convolution_milo_", "conv ").replace("dedispersion_milo_", "dedisp ")


def table(result: dict) -> str:
    spaces = list(result["spaces"])
    head = f"{'strategy':28s}" + "".join(f"{_short(s):>14s}" for s in spaces) + \
        f"{'mean':>8s}"
    lines = ["score: mean (10th percentile seed)", head, "-" * len(head)]
    means = result.get("mean_over_spaces", {})
    order = sorted({n for r in result["spaces"].values() for n in r["scores"]},
                   key=lambda n: -means.get(n, -9))
    for n in ["auto (loo)"] + order:
        cells = []
        for s in spaces:
            sc = result["spaces"][s]["scores"]
            sc = sc.get("auto", {}).get("loo") if n == "auto (loo)" else sc.get(n)
            cells.append(f"{sc['mean']:+.2f}({sc['p10']:+.2f})" if sc else "-")
        m = result.get("loo_mean") if n == "auto (loo)" else means.get(n)
        lines.append(f"{n:28s}" + "".join(f"{c:>14s}" for c in cells) +
                     (f"{m:+8.3f}" if m is not None else ""))
    med = [result["spaces"][s].get("kt_median_strategy") for s in spaces]
    lines.append(f"{'KT median strategy':28s}" +
                 "".join(f"{m:+14.2f}" if m is not None else f"{'-':>14s}" for m in med))
    lines.append(f"{'budget B (evaluations)':28s}" +
                 "".join(f"{result['spaces'][s]['budget']:>14d}" for s in spaces))
    lines.append("")
    lines.append("evaluations to within 5% of the optimum: median over seeds (share of seeds "
                 "within B)")
    for n in ["auto"] + [k for k in order if k.startswith("kt:")]:
        cells = []
        for s in spaces:
            sc = result["spaces"][s]["scores"].get(n)
            if not sc:
                cells.append("-")
                continue
            e = sc["evals_to_5pct"]
            med_s = f"{e['median']:.0f}" if e["median"] is not None else ">B"
            cells.append(f"{med_s}({e['reached']:.2f})")
        lines.append(f"{n:28s}" + "".join(f"{c:>14s}" for c in cells))
    for n in sorted({k for r in result["spaces"].values()
                     for k in r["scores"].get("auto", {}) if k.startswith("evals_to_5pct_")}):
        cells = []
        for s in spaces:
            e = result["spaces"][s]["scores"].get("auto", {}).get(n)
            med_s = "-" if not e else (f"{e['median']:.0f}" if e["median"] is not None else ">N")
            cells.append(f"{med_s}({e['reached']:.2f})" if e else "-")
        lines.append(f"{n.replace('evals_to_5pct_', ''):28s}" + "".join(f"{c:>14s}"
                                                                      for c in cells))
    lines.append(f"{'random search (expected)':28s}" + "".join(
        f"{result['spaces'][s]['random_evals_to_5pct']:>14.0f}" for s in spaces))
    return "\n".join(lines)
