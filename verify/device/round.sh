#!/usr/bin/env bash
# The DDTREE round on the lent H200, from the repository root, with the wheelhouse carried in
# .carry/wheelhouse-sm90 (verify/sglang/device.sh installs it):
#
#   bash verify/device/round.sh tests            # GPU tests of the round and the test hook: fused tail/accept, graph replay, no host sync
#   bash verify/device/round.sh served CONFIG... # verify/bench/served_round.py: one server at a time: first requests, steady tok/s, launches per round
#   bash verify/device/round.sh tiers            # the verify/sglang tier, its five modules side by side
#   bash verify/device/round.sh bench [ARGS...]  # repro bench test-h200-tp1: DDTREE B 32, DFLASH, AR at c 1 and 4,
#                                                # 8 requests of 512 tokens per cell (ARGS go to repro bench)
#                                                # (--interleave: the three servers at once, measured in turns)
#   bash verify/device/round.sh ab [ARGS...]     # the commit graph A/B: six servers at once (--interleave), DDTREE
#                                                # B 32 with the commit in CUDA graphs and eager, DFLASH and AR twice
#                                                # each (their spread is the noise floor), c 1 and 4, 8 x 512 tokens
#   bash verify/device/round.sh host [ALGO...]   # where the host's time goes in a served round of test-h200-tp1
#                                                # (decode_busy --with-stack, profiled 1 s into a 3,800-token request;
#                                                # DDTREE DFLASH AR by default)
#   NORADIX=1 before bench or host: test-h200-tp1 with the radix cache off (a profiles.toml variant)
#
# Logs and results land in $OUT (default build/device). Each stage fits one 10-minute device command.
set -uo pipefail
OUT=${OUT:-build/device}
MODELS=${MODELS:-/tmp/models}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
SGL="bash verify/sglang/device.sh"
stage=${1:-}
shift || true
case $stage in tests | served | tiers | bench | ab | host) ;;
*) echo "round.sh: stage must be tests, served, tiers, bench, ab or host (got '$stage')" >&2; exit 2 ;;
esac
OUT=$OUT/setup $SGL -- true >"$OUT/setup.log" 2>&1 || { tail -20 "$OUT/setup.log"; exit 1; }
variant=()
if [ -n "${NORADIX:-}" ]; then  # bench, host: the shipped profiles with test-h200-tp1's radix cache off
  sed '/^\[profiles.test-h200-tp1\]/,/^sglang = /s/^sglang = { /sglang = { disable-radix-cache = true, /' \
    repro/data/profiles.toml >"$OUT/profiles-noradix.toml"
  variant=(--profile-file "$OUT/profiles-noradix.toml")
fi
case $stage in
tests)
  $SGL -- python3 -m pytest verify/gpu/test_round_gpu.py verify/gpu/test_test_hook.py -q -rfEs -p no:cacheprovider >"$OUT/gpu_round.log" 2>&1
  rc=$?
  tail -n 15 "$OUT/gpu_round.log"
  ;;
served)
  OUT=$OUT/served $SGL -- python3 -m verify.bench.served_round --models "$MODELS" --out "$OUT/served" "$@" \
    >"$OUT/served.log" 2>&1
  rc=$?
  grep -v '^\[' "$OUT/served.log" | tail -n 40
  ;;
tiers)
  pids=()
  for mod in test_sglang_kernels test_ddtree_sampling test_ddtree_mla_moe test_ddtree_greedy test_ddtree_recording; do
    OUT=$OUT/$mod REPRO_E2E_PARALLEL=${PARALLEL:-2} timeout "${TIER_LIMIT:-560}" \
      $SGL "verify/sglang/$mod.py" -q -rfEs >"$OUT/$mod.log" 2>&1 &
    pids+=($!)
  done
  rc=0
  for p in "${pids[@]}"; do wait "$p" || rc=1; done
  for mod in test_sglang_kernels test_ddtree_sampling test_ddtree_mla_moe test_ddtree_greedy test_ddtree_recording; do
    echo "== $mod"; tail -n 6 "$OUT/$mod.log"
  done
  ;;
bench)
  python3 -c "import json; from verify.bench.served_round import prompts
for p in prompts(8, 0): print(json.dumps({'input_ids': p}))" >"$OUT/prompts.jsonl"
  OUT=$OUT/bench $SGL -- python3 -m repro.cli bench test-h200-tp1 --algorithms DDTREE,DFLASH,AR --budgets 32 \
    --concurrency 1,4 --max-new-tokens 512 --num-prompts 8 --prompts "$OUT/prompts.jsonl" --models-dir "$MODELS" \
    --warmup 1 -o "$OUT/bench${NORADIX:+-noradix}.jsonl" --start-timeout "${START_TIMEOUT:-480}" --time-limit "${TIME_LIMIT:-420}" --log-dir "$OUT/logs" "${variant[@]}" "$@" \
    >"$OUT/bench.log" 2>&1
  rc=$?
  grep -v '^\[' "$OUT/bench.log" | tail -n 20
  ;;
ab)
  python3 -c "import json; from verify.bench.served_round import prompts
for p in prompts(8, 0): print(json.dumps({'input_ids': p}))" >"$OUT/prompts.jsonl"
  # test-h200-tp1 with its KV cache capped (six servers share the GPU) and a copy, -eager, whose
  # environment keeps the commit eager
  python3 - "$OUT/profiles-ab.toml" <<'PY'
import sys
text = open("repro/data/profiles.toml").read()
head = "[profiles.test-h200-tp1]"
start = text.index(head)
end = text.index("\n[", start + 1)
block = text[start:end].replace("mem-fraction-static = 0.3,", "mem-fraction-static = 0.3, max-total-tokens = 65536,")
hook = 'env = { SGLANG_DDTREE_TEST_DRAFTER = "{models}/hook.json" }'
eager = block.replace(head, "[profiles.test-h200-tp1-eager]").replace(
    hook, hook[:-2] + ', SGLANG_DDTREE_COMMIT_GRAPHS = "0" }')
assert "max-total-tokens" in block and "COMMIT_GRAPHS" in eager, "profiles.toml changed: update round.sh ab"
open(sys.argv[1], "w").write(text[:start] + block + "\n" + eager + text[end:])
PY
  OUT=$OUT/ab $SGL -- python3 -m repro.cli bench test-h200-tp1 test-h200-tp1-eager --profile-file "$OUT/profiles-ab.toml" \
    --algorithms DDTREE,DFLASH,AR --budgets 32 --interleave --concurrency 1,4 --max-new-tokens 512 --num-prompts 8 \
    --prompts "$OUT/prompts.jsonl" --models-dir "$MODELS" --warmup 1 -o "$OUT/ab.jsonl" \
    --start-timeout "${START_TIMEOUT:-480}" --time-limit "${TIME_LIMIT:-420}" --log-dir "$OUT/ab-logs" "$@" >"$OUT/ab.log" 2>&1
  rc=$?
  grep -v '^\[' "$OUT/ab.log" | tail -n 20
  grep -h "DDTREE commit" "$OUT"/ab-logs/*.log
  ;;
host)
  rc=0
  for algo in ${@:-DDTREE DFLASH AR}; do
    OUT=$OUT/host $SGL -- python3 -m verify.bench.decode_busy test-h200-tp1 --algorithm "$algo" --with-stack --settle 1 --max-new-tokens 3800 \
      --models-dir "$MODELS" "${variant[@]}" --out "$OUT/host${NORADIX:+-noradix}" >>"$OUT/host.log" 2>&1 || rc=1
  done
  tail -n 5 "$OUT/host.log"
  ;;
esac
exit $rc
