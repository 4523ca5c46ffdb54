"""One tile with and without a cluster, by K's row pitch, from a sweep's results (no GPU).

    python benchmarks/sweep_pitch.py [benchmarks/results/gemm_sweep_h200.json] [--tile 128x256]

For every shape of the results file (gemm_sweep.py's records, whose `tried` lists hold each
trial's configuration key and measured ratio), the best ratio any trial of the tile reached
without a cluster and with one, beside the pitch K x 2 bytes taken mod 32 and mod 128: the table
behind gemm_wgmma.md's "row pitch off 32-byte sectors" (rows off sectors lose without clusters,
rows on them do not)."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def pitch_table(records, params, tile=(128, 256)) -> list[dict]:
    """Rows {shape, pitch_mod32, pitch_mod128, no_cluster, cluster} for the shapes where the
    tile was tried both ways; `params` are the template's parameter names in key order."""
    rows = []
    for r in records:
        best = {False: None, True: None}
        for key, status, ratio in r.get("tried", []):
            v = dict(zip(params, map(int, key.split(","))))
            if status != "measured" or ratio is None or (v["BM"], v["BN"]) != tile:
                continue
            c = v["CLUSTER"] > 1
            best[c] = ratio if best[c] is None else max(best[c], ratio)
        if best[False] is not None and best[True] is not None:
            pitch = r["shape"][2] * 2
            rows.append({"shape": r["shape"], "pitch_mod32": pitch % 32,
                         "pitch_mod128": pitch % 128, "no_cluster": best[False],
                         "cluster": best[True]})
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("results", nargs="?",
                    default=str(ROOT / "benchmarks/results/gemm_sweep_h200.json"))
    ap.add_argument("--tile", default="128x256")
    args = ap.parse_args(argv)
    from porter.spec.template import find_template
    params = find_template("gemm_wgmma").param_names
    doc = json.loads(Path(args.results).read_text())
    tile = tuple(int(x) for x in args.tile.split("x"))
    print(f"{'shape':>18s} {'pitch%32':>8s} {'%128':>5s} {'no cluster':>10s} {'cluster':>8s}")
    for row in pitch_table(doc["records"], params, tile):
        print(f"{'x'.join(map(str, row['shape'])):>18s} {row['pitch_mod32']:8d} "
              f"{row['pitch_mod128']:5d} {row['no_cluster']:10.3f} {row['cluster']:8.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
