#!/usr/bin/env bash
# The example bench runs behind docs/examples/test-models-h200/, on a lent two-H200 host, from the repository root,
# with the wheelhouse of docs/SGLANG.md (.carry/wheelhouse-sm90) and .carry/human-eval.zip:
#
#   bash verify/device/examples.sh single   # GPU 0: test-h200-tp1, AR/DFLASH/DDTREE 8,32,128 x c 1,4,16;
#                                           # GPU 1 meanwhile: SGLang kernel tier vs its golden, tree-kernel GPU tests
#                                           # (one GPU: the kernel tier first, then the bench)
#   bash verify/device/examples.sh multi    # both GPUs: test-h200-moe-tp2 vs test-h200-moe-ep2, AR and DDTREE
#   bash verify/device/examples.sh report   # repro report over every results file -> $OUT/examples
#
# Each stage fits one 10-minute device command; bench stages stop starting work at their time limit
# and the same stage with RESUME=1 finishes what is missing (results in $OUT, fsynced per request).
# Keep the machine's NCCL_* / TORCH_SYMM_MEM_* / NVSHMEM_* settings exported: every process inherits them.
set -uo pipefail
OUT=${OUT:-build/device}
MODELS=${MODELS:-/tmp/models}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SGL="bash verify/sglang/device.sh"
BENCH=(python3 -m repro.cli bench --models-dir "$MODELS" --num-prompts 16 --max-new-tokens 128
       --concurrency 1,4,16 --log-dir "$OUT/logs" ${RESUME:+--resume})
case ${1:-} in
single | multi | report) ;;
*) echo "examples.sh: stage must be single, multi or report (got '${1:-}')" >&2; exit 2 ;;
esac
OUT=$OUT/setup $SGL -- true >"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }

case ${1:-} in
single)
  kernel_tier() {
    OUT=$OUT/kernels timeout 200 $SGL verify/sglang/test_sglang_kernels.py -q -rfEs >"$OUT/kernels.log" 2>&1
  }
  if (( $(nvidia-smi -L | wc -l) >= 2 )); then
    (
      export CUDA_VISIBLE_DEVICES=1
      kernel_tier
      PYTHONPATH=$PWD timeout 300 python3 -m pytest verify/gpu/test_tree_build.py verify/gpu/test_ddtree_gpu.py -q -rfEs \
        -p no:cacheprovider >"$OUT/gpu_tests.log" 2>&1
    ) &
  else  # one GPU: the kernel tier first, so it does not share the GPU with the timed bench
    kernel_tier
    echo "one GPU: the tree-kernel GPU tests are left to verify/device/gpu_tier.sh tests" >"$OUT/gpu_tests.log"
  fi
  CUDA_VISIBLE_DEVICES=0 $SGL -- "${BENCH[@]}" test-h200-tp1 --budgets 8,32,128 -o "$OUT/h200-tp1.jsonl" \
    --time-limit "${TIME_LIMIT:-480}" >"$OUT/h200-tp1.log" 2>&1
  rc=$?
  wait
  tail -n 4 "$OUT/kernels.log" "$OUT/gpu_tests.log" "$OUT/h200-tp1.log"
  ;;
multi)
  $SGL -- "${BENCH[@]}" test-h200-moe-tp2 test-h200-moe-ep2 --algorithms AR,DDTREE -o "$OUT/h200x2-tp-ep.jsonl" \
    --time-limit "${TIME_LIMIT:-500}" >"$OUT/tp-ep.log" 2>&1
  rc=$?
  tail -n 12 "$OUT/tp-ep.log"
  ;;
report)
  $SGL -- python3 -m repro.cli report "$OUT"/*.jsonl -o "$OUT/examples" >"$OUT/report.log" 2>&1
  rc=$?
  tail -n 3 "$OUT/report.log"
  ;;
esac
exit "$rc"
