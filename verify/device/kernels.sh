#!/usr/bin/env bash
# Device run for the fused DDTree kernels. From the repository root:
#
#   bash verify/device/kernels.sh tests   # top-K GPU correctness tests + pytest-benchmark smoke (~3-5 min)
#   bash verify/device/kernels.sh tree    # tree/verify kernel GPU tests, then bench_tree at bs 32, B 256,
#                                         # peaked and N(0, 1) drafters (~6-8 min cold, ~3 min warm)
#   bash verify/device/kernels.sh sweep   # select + key-size sweep, then the full JSON table (~5-8 min)
#   SWEEP_STAGES=tail bash verify/device/kernels.sh sweep     # scan_tail off/on, then the table
#   bash verify/device/kernels.sh bench   # the full JSON table with the default config     (~2-3 min)
#   bash verify/device/kernels.sh profile # Nsight Compute: top-K kernels at bs 1 and 32, tree and
#                                         # verify kernels at bs 32, B 256, peaked drafter    (~4 min)
#
# Logs and JSON go to $OUT (default build/device): tests.log, junit-topk.xml, pytest-bench.json,
# tree_tests.log, junit-tree.xml, bench_tree.json,
# bench.log, bench_topk.json, profile.log, ncu.txt, topk.ncu-rep,
# source_sass.csv.xz, source_py.csv.xz (per-instruction / per-line stall samples), gpu.txt. Exit status is non-zero
# if a test failed or a result was not exact. Each phase fits in one 10-minute device command.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-build/device}
mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
# Triton's compile cache inside the (ignored) build folder: kept between calls on a warm machine,
# where cold compiles of the B 256 kernels cost minutes.
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/build/triton-cache}
PY=${PYTHON:-python3}
phase=${1:-tests}
rc=0
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv >"$OUT/gpu.txt" 2>&1
"$PY" -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' >>"$OUT/gpu.txt" 2>&1

case $phase in
tests)
  xdist=()
  "$PY" -c 'import xdist' 2>/dev/null && xdist=(-n 8)
  timeout 420 "$PY" -m pytest verify/gpu/test_topk_lse.py verify/bench/test_bench_topk.py -q -rfEs \
    -p no:cacheprovider "${xdist[@]}" --benchmark-disable --junitxml="$OUT/junit-topk.xml" 2>&1 | tee "$OUT/tests.log"
  rc=${PIPESTATUS[0]}
  timeout 150 "$PY" -m pytest verify/bench/test_bench_topk.py -q -p no:cacheprovider --benchmark-only \
    --benchmark-json="$OUT/pytest-bench.json" 2>&1 | tail -20 | tee -a "$OUT/tests.log"
  ;;
tree)
  xdist=()
  "$PY" -c 'import xdist' 2>/dev/null && xdist=(-n 8)
  timeout 330 "$PY" -m pytest verify/gpu/test_tree_build.py -q -rfEs -p no:cacheprovider "${xdist[@]}" \
    --junitxml="$OUT/junit-tree.xml" 2>&1 | tail -20 | tee "$OUT/tree_tests.log"
  rc=${PIPESTATUS[0]}
  timeout 200 "$PY" -m verify.bench.bench_tree --bs 32 --budget 256 --dist peaked randn --iters 20 \
    --out "$OUT/bench_tree.json" 2>&1 | tail -5 | tee -a "$OUT/tree_tests.log"
  [[ ${PIPESTATUS[0]} == 0 ]] || rc=1
  ;;
sweep | bench)
  args=(--adversarial)
  [[ $phase == sweep ]] && args+=(--sweep --stages "${SWEEP_STAGES:-select,keys}")  # stream: SWEEP_STAGES=stream (36 variants, ~10 min)
  timeout 570 "$PY" -m verify.bench.bench_topk "${args[@]}" --out "$OUT/bench_topk.json" 2>&1 | tee "$OUT/bench.log"
  rc=${PIPESTATUS[0]}
  ;;
profile)
  ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  [[ -n $ncu ]] || { echo "kernels.sh: ncu not found" >&2; exit 2; }
  cat >/tmp/topk_profile.py <<'PY'
import torch
from repro.ddtree import TopK
from repro.kernels.topk_lse import topk_lse
from repro.kernels.tree_build import build_trees_fused, verify_tensors_fused
from verify.bench.bench_tree import draft_logits
for bs in (1, 32):
    x = draft_logits(bs, 15, 163840, "randn", "cuda")
    for _ in range(2):  # compile, then the launch to read
        topk_lse(x, 256)
        torch.cuda.synchronize()
x = draft_logits(32, 15, 163840, "peaked", "cuda")
topk = TopK(*topk_lse(x, 256), 163840)
roots, lens = torch.zeros(32, dtype=torch.int64, device="cuda"), torch.full((32,), 1000, device="cuda")
for _ in range(2):
    verify_tensors_fused(build_trees_fused(topk, 256, roots), lens, 32000)
    torch.cuda.synchronize()
PY
  timeout 450 "$ncu" --clock-control none --set full --import-source yes \
    -k 'regex:stream_kernel|select_kernel|tree_kernel|verify_kernel' -f -o "$OUT/topk" \
    "$PY" /tmp/topk_profile.py 2>&1 | tail -40 | tee "$OUT/profile.log"
  rc=${PIPESTATUS[0]}
  "$ncu" --import "$OUT/topk.ncu-rep" --page details >"$OUT/ncu.txt" 2>&1
  # per-instruction stall samples (SASS) and per-line (Python source) of the kernels read above
  "$ncu" --import "$OUT/topk.ncu-rep" --page source --csv --print-source sass >"$OUT/source_sass.csv" 2>&1
  "$ncu" --import "$OUT/topk.ncu-rep" --page source --csv --print-source cuda >"$OUT/source_py.csv" 2>&1
  xz -T0 -6 "$OUT/source_sass.csv" "$OUT/source_py.csv"
  ;;
*)
  echo "kernels.sh: phase must be tests, tree, sweep, bench or profile (got $phase)" >&2
  exit 2
  ;;
esac
exit "$rc"
