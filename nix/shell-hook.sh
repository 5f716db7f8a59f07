# Sourced by each devShell and verify app (nix/env.nix sets REPRO_TARGET and REPRO_DRIVER_LIBS).
# Links only the driver's libraries into a private directory (never all of /usr/lib: glibc clash),
# points Triton at it, and gives Triton a writable cache.
unset PYTHONPATH
if [ -z "${REPRO_DRIVER_DIR:-}" ]; then
  if [ -e /run/opengl-driver/lib/libcuda.so.1 ]; then
    REPRO_DRIVER_DIR=/run/opengl-driver/lib # NixOS
  else
    REPRO_DRIVER_DIR="${XDG_RUNTIME_DIR:-${TMPDIR:-/tmp}}/repro-driver-$(id -u)"
    mkdir -p "$REPRO_DRIVER_DIR"
    for d in ${REPRO_DRIVER_SEARCH_PATH:-/usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib/wsl/lib}; do
      for g in $REPRO_DRIVER_LIBS; do
        for f in "$d"/$g; do
          if [ -e "$f" ]; then ln -sfn "$f" "$REPRO_DRIVER_DIR/${f##*/}"; fi
        done
      done
    done
  fi
fi
export REPRO_DRIVER_DIR
export TRITON_LIBCUDA_PATH="$REPRO_DRIVER_DIR"
export LD_LIBRARY_PATH="$REPRO_DRIVER_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
: "${TRITON_CACHE_DIR:=${XDG_CACHE_HOME:-$HOME/.cache}/repro/triton-$REPRO_TARGET}"
export TRITON_CACHE_DIR
mkdir -p "$TRITON_CACHE_DIR"
