#!/bin/bash
# The GEMM work that waits for a device visit, as one command on the device machine (repository
# root, $OUT set by the device tool). Carry the wheels (`../shared/tools/device-wheels optuna
# sqlalchemy alembic colorlog pytest pytest-timeout` writes .whl/): the device's Python has
# cupy, torch and numpy but not the rest.
#   bash benchmarks/device_runs.sh sweep=LABEL   H200: the five weak bf16 shapes re-ported and
#                                                merged into gemm_sweep_h200.json (~250 s),
#                                                their records labelled LABEL; SWEEP_SHAPES=
#                                                M1xN1xK1,... re-ports those instead (the weak
#                                                ones among them searched longer), SWEEP_S=N
#                                                gives the step N seconds (default 250),
#                                                SWEEP_ANY_GPU=1 runs it on another GPU too;
#                                                SWEEP_SHAPES=all: every shape of the sweep but
#                                                SWEEP_SKIP's (M1xN1xK1,...);
#                                                cuBLAS's kernels for the shapes are read first
#                                                (baseline_kernels.py) and their tiles seeded
#                                                (SWEEP_VENDOR=0: not); SWEEP_WARM_FROM=RESULTS
#                                                adds another GPU's sweep as warm-start sources
#   bash benchmarks/device_runs.sh fp8           gemm_fp8's ping-pong GPU cases first (their
#                                                picks are left out if they fail), then the final
#                                                over gemm_fp8_picks.json (~80 s on an H100,
#                                                eleventh session; ~60 s more for the cases)
#   bash benchmarks/device_runs.sh tests         the fp8 and engine GPU tests (~270 s; cases an
#                                                earlier step passed on this machine left out)
#   bash benchmarks/device_runs.sh probe         cuBLAS's own tiles at the weak shapes (~200 s)
#   bash benchmarks/device_runs.sh quick         only the GPU tests of what no GPU has run yet
#                                                (gemm_fp8's ping-pong, e5m2, PSETS=2, BN 160
#                                                cases, ~20 s once compiled, ~60 s cold)
#   bash benchmarks/device_runs.sh promo         the tensor maps' L2 promotion (the default
#                                                256 B, then NONE) at the weak shapes whose row
#                                                pitch is off 32-byte sectors and at K = 1024 /
#                                                1016 / 1008 (gemm_probe_l2_promotion.json, ~160 s)
#   bash benchmarks/device_runs.sh e5m2          the gemm_fp8_e5m2 variant (A in e5m2) timed
#                                                with the fast-accumulation picks (~45 s)
#   bash benchmarks/device_runs.sh fp8p          the final over the promoted picks alone (both
#                                                scalings, ~35 s: PSETS=2 beside the others)
#   bash benchmarks/device_runs.sh twins         each promoted pick beside its fast twin (the same
#                                                configuration with PROMOTE 0), per-tensor
#                                                scales: promotion's own cost per tile, after
#                                                the half-width set's GPU cases (~150 s)
#   bash benchmarks/device_runs.sh intervals     promotion every 1, 2, 4 k-tiles and two sets at
#                                                128 x 128 / 144, PSPLIT at 128 x 192 / 256,
#                                                beside fast twins (~90 s)
#   bash benchmarks/device_runs.sh trace         the CTAs' timelines (gemm_trace.py) of 256-row
#                                                tiles beside 128x256 at aligned K: how long a
#                                                k-tile takes with real loads (~120 s);
#                                                TRACE_PROBES=FILE traces FILE's configurations
#                                                (gemm_trace_pingpong.json: ping-pong beside
#                                                cooperative, how long a consumer's k-loop and
#                                                the hand-over between the two take);
#                                                TRACE_TEMPLATE=gemm_fp8 with
#                                                gemm_trace_fp8.json: fp8's 128-wide tiles
#   bash benchmarks/device_runs.sh rate          the tensor pipe's rate for each tile shape's
#                                                k-loop alone and with loads (wgmma_rate.py, ~15 s)
#   bash benchmarks/device_runs.sh ring          gemm_wgmma's EPI=5 (the epilogue staged in the
#                                                ring: a stage more) - its GPU tests, then probed
#                                                against EPI=3 at the weak shapes (~200 s)
#   bash benchmarks/device_runs.sh prefetch      gemm_wgmma with the tensor maps' descriptors
#                                                prefetched at entry (DEV_EARLY_PREFETCH=1)
#                                                against after the start barrier, two passes of
#                                                gemm_probe_early_prefetch.json (~120 s)
# Several at once: bash benchmarks/device_runs.sh sweep=visitN fp8 (each step has its timeout).
# BUDGET_S=N: the steps share N seconds (the call's limit): each step's timeout is cut to what is
# left, and a step with under half its usual time left is skipped (partial results still land:
# the fp8 final and the probes write their files after every record).
# Results land under $OUT (sweep/, fp8/, probe/): the device tool brings back 8 files at most.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site \
  .whl/*.whl 2>&1 | tail -2
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PORTER_CACHE_DIR=/tmp/porter-cache
GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "GPU: $GPU"; date
T0=$(date +%s)
# the step's usual timeout, cut to the seconds left of BUDGET_S
# (at least 1: `timeout 0` would mean none)
cap() {
  local left=$(( ${BUDGET_S:-100000} - $(date +%s) + T0 ))
  left=$(( left < 1 ? 1 : left )); echo $(( $1 < left ? $1 : left ))
}
# gemm_fp8_picks.json's picks for which COND (Python, over a pick x) holds, written to FILE
picks_where() {
  python3 -c "import json; p = json.load(open('benchmarks/gemm_fp8_picks.json')); json.dump([x for x in p if $1], open('$2', 'w'))"
}
# GPU test cases (pytest -k expressions) that passed in an earlier step or call on this
# machine: the tests step leaves them out rather than run them twice
PASSED=/tmp/gpu_tests_passed
PP_CASES="test_gpu_gemm_fp8 and scaling_mode and PINGPONG"
NEW_CASES="test_gpu_gemm_fp8 and (PINGPONG or e5m2 or PSETS or BN160)"
PSPLIT_CASES="test_gpu_gemm_fp8 and scaling_mode and PSPLIT"
# the half-width promotion set's GPU cases (PSPLIT 2, nineteenth session) passed on this machine,
# run now if no step has run them yet; a step leaves the PSPLIT picks out where they fail
psplit_ok() {
  grep -qxF "$PSPLIT_CASES" $PASSED 2>/dev/null && return 0
  timeout -s INT $(cap 90) python3 -m pytest -q -x --timeout 60 -p no:cacheprovider \
    tests/test_gpu_gemm_fp8.py -k "$PSPLIT_CASES" 2>&1 | tail -4
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "PSPLIT cases failed: its picks are left out"; return 1; }
  echo "$PSPLIT_CASES" >> $PASSED
}
# FILE's picks without PSPLIT 2, written to OUT
no_psplit() {
  python3 -c "import json; json.dump([x for x in json.load(open('$1'))
    if x['params'].get('PSPLIT', 1) == 1], open('$2', 'w'))"
}
declare -A NEED=([fp8]=240 [tests]=330 [quick]=120 [e5m2]=100 [promo]=220 [probe]=220 [rate]=30 [fp8p]=90 [twins]=180 [intervals]=150 [trace]=150 [ring]=200 [prefetch]=150)
WEAK=1000x3000x1000,3000x5000x1000,1536x1536x1536,7000x9000x3000,3000x4000x4104
while [ $# -gt 0 ]; do
  step=$1; shift
  need=${NEED[${step%%=*}]:-${SWEEP_S:-250}}
  left=$(cap $need)
  if [ "$left" -lt $((need / 2)) ]; then echo "$step: $left s left of BUDGET_S, skipped"; continue; fi
  case $step in
    sweep=*)
      label=${step#sweep=}
      # SWEEP_SHAPES=all: every shape of gemm_sweep.py's SHAPES but those in SWEEP_SKIP
      if [ "$SWEEP_SHAPES" = all ]; then
        SWEEP_SHAPES=$(SKIP="$SWEEP_SKIP" python3 -c "import os, sys; sys.path.insert(0, 'benchmarks')
import gemm_sweep as g
skip = set(filter(None, os.environ['SKIP'].split(',')))
print(','.join(x for s in g.SHAPES if (x := 'x'.join(map(str, s[1:]))) not in skip))")
      fi
      # another GPU only with SWEEP_ANY_GPU=1: a port from the H200's answers (--warm-from),
      # its own file, nothing merged into the H200's
      src="--merge benchmarks/results/gemm_sweep_h200.json"
      if ! echo "$GPU" | grep -q H200; then
        if [ -z "$SWEEP_ANY_GPU" ]; then echo "sweep: not an H200, skipped"; continue; fi
        src="--warm-from benchmarks/results/gemm_sweep_h200.json"
      elif [ -n "$SWEEP_WARM_FROM" ]; then
        # the H200 ported from another GPU's answers (the same shape's among the seeds)
        src="$src --warm-from $SWEEP_WARM_FROM"
      fi
      # the kernels cuBLAS runs for these shapes: their tiles are a seed each (SWEEP_VENDOR=0:
      # none, the warm start as before)
      vendor=""
      if [ "${SWEEP_VENDOR:-1}" != 0 ]; then
        timeout $(cap 60) python3 benchmarks/baseline_kernels.py --out "$OUT/vendor" --no-fp8 \
          --bf16 ${SWEEP_SHAPES:-$WEAK} 2>&1 | tail -3
        [ -f "$OUT/vendor/baseline_kernels.json" ] && \
          vendor="--vendor-kernels $OUT/vendor/baseline_kernels.json"
      fi
      ss=${SWEEP_S:-250}
      timeout $(cap $ss) python3 benchmarks/gemm_sweep.py --out "$OUT/sweep" --db /tmp/sweep.db \
        --label "$label" $src $vendor \
        --shapes ${SWEEP_SHAPES:-$WEAK} --deep $WEAK --deep-min-trials 45 \
        --deadline-s $((ss - 130)) 2>&1 | tail -30
      echo "sweep rc ${PIPESTATUS[0]}" ;;
    fp8)
      picks=benchmarks/gemm_fp8_picks.json
      if grep -qxF "$NEW_CASES" $PASSED 2>/dev/null; then
        rc=0   # the quick step passed them (and more) on this machine
      else
        timeout -s INT $(cap 80) python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_gemm_fp8.py \
          -k "$PP_CASES" 2>&1 | tail -6
        rc=${PIPESTATUS[0]}
      fi
      if [ "$rc" != 0 ]; then
        echo "ping-pong cases failed: the final leaves the ping-pong picks out"
        picks_where "not x['params'].get('PINGPONG')" /tmp/picks.json
        picks=/tmp/picks.json
      else
        echo "$PP_CASES" >> $PASSED
      fi
      if ! psplit_ok; then no_psplit $picks /tmp/picks_np.json; picks=/tmp/picks_np.json; fi
      timeout $(cap 300) python3 benchmarks/gemm_fp8.py --out "$OUT/fp8" --final --params $picks 2>&1 | tail -40
      echo "fp8 rc ${PIPESTATUS[0]}" ;;
    tests)
      skip=$(awk '{printf "%snot (%s)", (NR > 1 ? " and " : ""), $0}' $PASSED 2>/dev/null)
      timeout -s INT $(cap 330) python3 -m pytest -q --timeout 150 -p no:cacheprovider tests/test_gpu_gemm_fp8.py \
        tests/test_gpu.py ${skip:+-k "$skip"} 2>&1 | tail -25
      echo "tests rc ${PIPESTATUS[0]}" ;;
    quick)
      timeout -s INT $(cap 160) python3 -m pytest -q --timeout 120 -p no:cacheprovider \
        tests/test_gpu_gemm_fp8.py -k "$NEW_CASES" 2>&1 | tail -12
      rc=${PIPESTATUS[0]}; echo "quick rc $rc"
      if [ "$rc" = 0 ]; then echo "$NEW_CASES" >> $PASSED; fi ;;
    fp8p)
      picks_where "x['size'][4] == 2" /tmp/picks_promoted.json
      timeout $(cap 200) python3 benchmarks/gemm_fp8.py --out "$OUT/fp8p" --final \
        --params /tmp/picks_promoted.json 2>&1 | tail -12
      echo "fp8p rc ${PIPESTATUS[0]}" ;;
    twins)
      # each promoted pick beside its fast twin (PROMOTE 0, one set; the same tile, stages,
      # cluster and schedule), per-tensor scales: what promotion itself costs at each tile,
      # apart from what the tile costs (the finalists' ours_ms, pick against twin)
      picks=benchmarks/gemm_fp8_picks.json
      if ! psplit_ok; then no_psplit $picks /tmp/picks_np.json; picks=/tmp/picks_np.json; fi
      python3 -c "import json
p = [x for x in json.load(open('$picks')) if x['size'][4] == 2]
tw = [{'size': x['size'][:4] + [1], 'params': {**{k: v for k, v in x['params'].items()
      if k not in ('PSETS', 'PSPLIT')}, 'PROMOTE': 0, 'ORDERED': 0}} for x in p]
json.dump(p + [t for i, t in enumerate(tw) if t not in tw[:i]], open('/tmp/picks_twins.json', 'w'))"
      timeout $(cap 200) python3 benchmarks/gemm_fp8.py --out "$OUT/twins" --final --scalings 1 \
        --params /tmp/picks_twins.json 2>&1 | tail -12
      echo "twins rc ${PIPESTATUS[0]}" ;;
    intervals)
      # promotion every 1, 2 and 4 k-tiles and with two sets at 128 x 128 and 128 x 144, and
      # the half-width set over 1 and 2 k-tiles at 128 x 192 and 128 x 256, beside their fast
      # twins (gemm_fp8_intervals.json), per-tensor: whether promotion's cost is its additions
      # (halved by P = 2) or its waits (hidden by two sets); the finalists carry their errors
      picks=benchmarks/gemm_fp8_intervals.json
      if ! psplit_ok; then no_psplit $picks /tmp/intervals_np.json; picks=/tmp/intervals_np.json; fi
      timeout $(cap 140) python3 benchmarks/gemm_fp8.py --out "$OUT/intervals" --final --scalings 1 \
        --params $picks 2>&1 | tail -8
      echo "intervals rc ${PIPESTATUS[0]}" ;;
    e5m2)
      picks_where "x['size'][4] == 1" /tmp/picks_e5m2.json
      timeout $(cap 150) python3 benchmarks/gemm_fp8.py --template gemm_fp8_e5m2 --out "$OUT/e5m2" \
        --final --params /tmp/picks_e5m2.json 2>&1 | tail -20
      echo "e5m2 rc ${PIPESTATUS[0]}" ;;
    promo)
      for v in L2_256B NONE; do
        PORTER_TMA_L2_PROMOTION=$v timeout $(cap 110) python3 benchmarks/gemm_probe.py \
          --out "$OUT/promo_$v" --probes benchmarks/gemm_probe_l2_promotion.json 2>&1 | tail -16
        echo "promo $v rc ${PIPESTATUS[0]}"
      done ;;
    trace)
      timeout $(cap 180) python3 benchmarks/gemm_trace.py --out "$OUT/trace" \
        --probes ${TRACE_PROBES:-benchmarks/gemm_trace_256.json} \
        --template ${TRACE_TEMPLATE:-gemm_wgmma} 2>&1 | tail -20
      echo "trace rc ${PIPESTATUS[0]}" ;;
    rate)
      timeout $(cap 90) python3 benchmarks/wgmma_rate.py --out "$OUT/rate" 2>&1 | tail -24
      echo "rate rc ${PIPESTATUS[0]}" ;;
    ring)
      # test_wgmma_side_by_side_interleaved's last four cases (config30-33) are EPI=5's
      timeout -s INT $(cap 150) python3 -m pytest -q --timeout 120 -p no:cacheprovider tests/test_gpu.py \
        -k "side_by_side and (config30 or config31 or config32 or config33)" 2>&1 | tail -8
      echo "ring tests rc ${PIPESTATUS[0]}"
      timeout $(cap 200) python3 benchmarks/gemm_probe.py --out "$OUT/ring" \
        --probes benchmarks/gemm_probe_ring_epi5.json 2>&1 | tail -24
      echo "ring probe rc ${PIPESTATUS[0]}" ;;
    prefetch)
      for pass in 1 2; do
        timeout $(cap 75) python3 benchmarks/gemm_probe.py --out "$OUT/prefetch_$pass" \
          --probes benchmarks/gemm_probe_early_prefetch.json 2>&1 | tail -14
        echo "prefetch pass $pass rc ${PIPESTATUS[0]}"
      done ;;
    probe)
      timeout $(cap 220) python3 benchmarks/gemm_probe.py --out "$OUT/probe" \
        --probes benchmarks/gemm_probe_vendor_tiles.json 2>&1 | tail -30
      echo "probe rc ${PIPESTATUS[0]}" ;;
    *) echo "unknown step $step (sweep=LABEL, fp8, fp8p, twins, intervals, tests, quick, probe, promo, e5m2, rate, trace, ring, prefetch)"; exit 2 ;;
  esac
  date
done
ls -R "$OUT" | head -30
