#!/usr/bin/env bash
# A session's GPU checks in one device call (device `run`, carry [".whl"]):
#   bash benchmarks/h200_check.sh [RESULTS_JSON ...]
# 1. the GPU tests (pytest -m gpu), one at a time on the one GPU;
# 2. the rest of the suite on that machine's Python 3.12 and NVRTC 13.0 (service, browser and
#    dashboard tests need Redis, PostgreSQL, Chromium and Streamlit, which it lacks);
# 3. gemm_wgmma's reported configurations re-timed side by side with cuBLAS (port_bench.py
#    --retime-results), by default the 4096^3 and 8192^3 records.
# .whl/ holds Python 3.12 wheels of optuna, sqlalchemy, alembic, mako and colorlog
# (../shared/tools/device-wheels optuna sqlalchemy alembic colorlog). Writes under $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PORTER_CACHE_DIR=/tmp/porter-cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,temperature.gpu,power.draw --format=csv
skip="--ignore-glob=tests/test_dashboard* --ignore-glob=tests/test_service*"
timeout 300 python3 -m pytest -q -p no:cacheprovider -m gpu -rs $skip tests \
  > "$OUT/pytest_gpu.log" 2>&1
echo "gpu tests: rc $?"; tail -25 "$OUT/pytest_gpu.log"
# in parallel, but the search tests alone: Optuna's GP sampler imports torch, whose import
# failed under pytest-xdist on that image (a schema error in torch's own custom ops)
timeout 200 python3 -m pytest -q -p no:cacheprovider -m "not gpu and not service and not browser" \
  -n 12 $skip --ignore-glob="tests/test_search*" tests > "$OUT/pytest_cpu.log" 2>&1
echo "other tests: rc $?"; grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest_cpu.log" | tail -25
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_search*.py > "$OUT/pytest_search.log" 2>&1
echo "search tests: rc $?"; tail -3 "$OUT/pytest_search.log"
results=${*:-benchmarks/results/gemm_wgmma_tpl6_tuned_a_h200.json}
timeout 150 python3 benchmarks/port_bench.py --out "$OUT/retime" --only gemm_wgmma \
  --retime-results "${results// /,}" > "$OUT/retime.log" 2>&1
echo "retime: rc $?"; tail -8 "$OUT/retime.log"
cp "$OUT/retime/results_retime.json" "$OUT/" 2>/dev/null || true
