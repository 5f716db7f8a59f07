#!/usr/bin/env bash
# The GPU tier on a machine that has torch + triton (the lent H200, a deployment box):
#   bash verify/device/gpu_tier.sh [STAGES]     STAGES from: info bench tests kernels (default: all)
# Writes logs and JSON under $OUT (default ./results/gpu). The top-K kernel's own GPU tests and
# sweep are verify/device/kernels.sh (about 40 kernel compiles: too slow to run serially here).
set -uo pipefail
OUT=${OUT:-results/gpu}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
STAGES=${*:-info bench tests}
for stage in $STAGES; do
  echo "=== $stage $(date -u +%T)"
  case $stage in
    info) nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
          python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)" ;;
    bench) timeout ${BENCH_TIMEOUT:-300} python3 -m verify.bench.bench_tree --bs 1 8 32 64 --budget 16 64 256 --iters 30 \
             --out "$OUT/bench_tree.json" 2>&1 | tee "$OUT/bench_tree.log" ;;
    tests) timeout ${TESTS_TIMEOUT:-400} python3 -m pytest verify/gpu --ignore=verify/gpu/test_topk_lse.py -q --maxfail=10 -p no:cacheprovider --benchmark-skip \
             --junitxml="$OUT/gpu_tests.xml" 2>&1 | tee "$OUT/gpu_tests.log" | tail -30 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
