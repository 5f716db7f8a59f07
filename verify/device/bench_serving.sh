#!/usr/bin/env bash
# repro bench and SGLang's bench_serving at the same open-loop loads and prompts, REPEATS times in turn, all
# against one DDTREE server of full-h200-qwen3-8b served with its planted tokenizer; each repeat compared
# (verify/bench/bench_serving_check.py), then the repeats pooled (verify/bench/bench_serving_pool.py). One
# device command (one H100 or H200), from the repository root with .carry/wheelhouse-sm90 and
# .carry/human-eval.zip as verify/device/experiments.toml's. RATES (6,18,30), NUM_PROMPTS (64), REPEATS (2),
# BACKENDS (sglang; sglang,sglang-oai adds repro bench --api openai and bench_serving through /v1/completions).
# Results: $DIR, packed into $OUT/bench-serving.tar.gz if OUT is set. On one H100 a cold server start took 200-250 s (71 s
# with the Triton cache of a warm machine) and a repeat 90-115 s: REPEATS=2 fits a fresh machine's 10 minutes (465 s, 12-06), 3 a warm one's.
set -uo pipefail
DIR=${BENCH_SERVING_DIR:-build/bench-serving} WH=${WHEELHOUSE:-.carry/wheelhouse-sm90} SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-/tmp/models} PROFILE=full-h200-qwen3-8b URL=http://127.0.0.1:${PORT:-30000} B=${BACKENDS:-sglang}
rm -rf "$DIR" && mkdir -p "$DIR"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false REPRO_MODELS_DIR=$MODELS
export TRITON_CACHE_DIR=${TRITON_CACHE_DIR:-$PWD/build/triton-cache}  # the experiment rows' cache: a warm machine reuses it
ZIPS=$(ls .carry/*.zip 2>/dev/null | tr '\n' ':') && export PYTHONPATH=$SITE:$PWD${ZIPS:+:${ZIPS%:}}
python3 -m verify.device.experiment seed-triton-cache  # a carried .carry/triton-cache.tar.gz spares the cold compile
timeout 240 python3 -m repro.cli install-offline "$WH" --site "$SITE" >"$DIR/install.log" 2>&1 || { tail -20 "$DIR/install.log"; exit 1; }
timeout 60 python3 -m repro.cli patch apply --site "$SITE" >"$DIR/patch.log" 2>&1 || { cat "$DIR/patch.log"; exit 1; }
[ -f "$MODELS/qwen3-8b/tokenizer.json" ] || timeout 120 python3 -m repro.cli testmodels "$MODELS" >"$DIR/models.log" 2>&1 || exit 1
# the shipped profile with its tokenizer: bench_serving sends text, which the server encodes to repro's token ids
sed "/^\[profiles.$PROFILE\]/,/^sglang = /s/^tokenizer = \"none\"/tokenizer = \"model\"/" repro/data/profiles.toml >"$DIR/profiles.toml"
python3 -m repro.cli serve $PROFILE --profile-file "$DIR/profiles.toml" --port "${URL##*:}" --log "$DIR/server.log" & server=$!
trap 'kill $server 2>/dev/null; wait $server; [ -n "${OUT:-}" ] && tar czf "$OUT/bench-serving.tar.gz" -C "$DIR" .' EXIT
until python3 -c "from repro.serving.sglang_client import Client as C; exit(not C('$URL').healthy())"; do
  kill -0 $server 2>/dev/null || { tail -30 "$DIR/server.log"; exit 1; }; sleep 5
done
common=(--url "$URL" --prompts humaneval-distinct --request-rate "${RATES:-6,18,30}" --num-prompts "${NUM_PROMPTS:-64}"
        --max-new-tokens 256 --warmup 1 --flush-cache)
for i in $(seq "${REPEATS:-2}"); do
  runs=("$DIR/native-$i.jsonl")
  timeout 150 python3 -m repro.cli bench $PROFILE "${common[@]}" -o "$DIR/native-$i.jsonl" 2>&1 | tail -4
  [[ $B == *sglang-oai* ]] && runs+=("$DIR/openai-$i.jsonl") &&
    timeout 150 python3 -m repro.cli bench $PROFILE "${common[@]}" --api openai -o "$DIR/openai-$i.jsonl" 2>&1 | tail -4
  timeout 300 python3 -m verify.bench.bench_serving_check "${runs[@]}" --url "$URL" --profile $PROFILE \
    --tokenizer "$MODELS/qwen3-8b" --out "$DIR/check-$i" --backends "$B" 2>&1 | tail -3
done
python3 -m verify.bench.bench_serving_pool "$DIR"/check-*/bench_serving_check.json --out "$DIR/bench_serving_pool.json"
