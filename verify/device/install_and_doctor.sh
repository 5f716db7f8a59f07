#!/usr/bin/env bash
# On the GPU machine, from the repository root (the checkout the device `run` call receives):
#   bash verify/device/install_and_doctor.sh [WHEELHOUSE] [SITE]
# Installs the carried wheelhouse with no network (twice: the second run must install nothing),
# runs `repro doctor --target sm90` on the pristine install, applies the DDTree patch series, and
# runs the doctor again (text and JSON). Everything lands under $OUT: *.log, doctor*.txt/json, and
# the raw nvidia-smi outputs under fixtures/ (to replace verify/fixtures/doctor/h200x1.csv and
# verify/fixtures/topology/h200x1.txt with real recordings).
# Exit status: the final doctor's (0 = every check ok or skip).
set -uo pipefail
WH=${1:-.carry/wheelhouse-sm90}
SITE=${2:-/tmp/repro-site}  # not /tmp/site: the device kit installs its own set there
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT/fixtures"
if [ -d /usr/local/cuda/bin ]; then export PATH=$PATH:/usr/local/cuda/bin CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}; fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
T0=$SECONDS
log() { echo "[+$((SECONDS - T0))s] $*"; }
repro() { timeout "$1" python3 -m repro.cli "${@:2}"; }

nvidia-smi --query-gpu=index,name,compute_cap,driver_version,memory.total,pci.bus_id \
  --format=csv,noheader,nounits > "$OUT/fixtures/query.csv" 2>&1
nvidia-smi topo -m > "$OUT/fixtures/topo.txt" 2>&1
nvidia-smi > "$OUT/fixtures/nvidia-smi.txt" 2>&1

log "install-offline $WH -> $SITE"
repro 180 install-offline "$WH" --site "$SITE" 2>&1 | tee "$OUT/install.log"
log "install-offline again (must install nothing)"
repro 120 install-offline "$WH" --site "$SITE" 2>&1 | tee "$OUT/install-again.log"

export PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH}
log "doctor on the pristine install"
repro 280 doctor --target sm90 --json > "$OUT/doctor-pristine.json" 2> "$OUT/doctor-pristine.err"
log "doctor (pristine) exit $?"

log "patch apply"
repro 60 patch apply --site "$SITE" 2>&1 | tee "$OUT/patch.log"
log "doctor on the patched install"
repro 280 doctor --target sm90 2>&1 | tee "$OUT/doctor.txt"
rc=${PIPESTATUS[0]}
log "doctor exit $rc"
repro 280 doctor --target sm90 --json > "$OUT/doctor.json" 2> "$OUT/doctor.err"
log "done"
exit "$rc"
