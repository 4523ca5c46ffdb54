# %% [markdown]
# # Port a kernel from Python and take the tuned kernel out
#
# A notebook-style walk through Kernel Porter's Python API (each `# %%` is a cell; run it as a
# script, `python examples/port_and_export.py --out DIR`, or open it in Jupyter/VS Code).
# It needs no GPU: the port replays measurements recorded on an H200 (gemm_mma at 4096^3), so
# every trial is a real measurement from that GPU, played back by the replay backend.

# %%
import argparse
import json
import tempfile
from pathlib import Path

import porter

ROOT = Path(__file__).resolve().parents[1]
RECORDING = ROOT / "tests" / "data" / "replay" / "gemm_mma_h200.json.gz"

parser = argparse.ArgumentParser(description="Kernel Porter's Python API on a replayed port")
parser.add_argument("--out", type=Path, default=None, help="folder for the database and exports")
args, _ = parser.parse_known_args()      # tolerant of a notebook kernel's own arguments
out = args.out or Path(tempfile.mkdtemp(prefix="porter-example-"))
out.mkdir(parents=True, exist_ok=True)
db = f"sqlite:///{out / 'example.db'}"

# %% [markdown]
# ## Port: 40 trials of the search, measured values from the recording

# %%
job = porter.port("gemm_mma", arch="sm_90a", sizes=[(4096, 4096, 4096)], trials=40,
                  backend="replay", replay=RECORDING, db=db, progress=False)
print(job)

# %% [markdown]
# ## What it found: the best configuration, and every trial as a DataFrame

# %%
best = job.best()
m = best["measurements"][0]
print(f"best: trial {best['trial']}, {m['ours_ms']:.4f} ms, {m['ratio']:.3f}x {m['baseline']}")
print("  ", " ".join(f"{k}={v}" for k, v in best["params"].items()))

trials = job.trials()
print(trials["status"].value_counts().to_string())
measured = trials[trials["status"] == "measured"].sort_values("ratio", ascending=False)
print(measured[["trial", "BM", "BN", "STAGES", "ours_ms", "ratio"]].head().to_string())

# %% [markdown]
# ## Export: a Python module (cubins + dispatch by size) and standalone CUDA source

# %%
written = job.export("python", out / "python") + job.export("cu", out / "cu")
manifest = json.loads((out / "python" / "manifest.json").read_text())
print(f"exported {len(written)} files; manifest: job {manifest['job']}, template "
      f"{manifest['template']} (snapshot {manifest['template_snapshot']}), {manifest['arch']}, "
      f"measured on {manifest['gpu']}")
for p in written:
    print("  ", p.relative_to(out))

# %% [markdown]
# On a machine with a GPU, the module runs without porter:
#
# ```python
# import sys; sys.path.insert(0, "OUT/python")
# import gemm_mma_tuned as k
# k.launch(A, B, C, M, N, K)        # torch tensors, CuPy arrays or raw device addresses
# ```
