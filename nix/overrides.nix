# Fix-ups uv2nix cannot infer for CUDA wheels, and the sglang patch series.
{
  lib,
  python,
  patchSrc,
}:
final: prev:
let
  site = python.sitePackages;
  # The NVIDIA/CUDA runtime wheels of uv.lock (cu13 builds, as torch 2.11.0 pins them).
  cudaWheels = lib.filter (n: lib.hasPrefix "nvidia-" n || lib.hasPrefix "cuda-" n) (
    builtins.attrNames prev
  );
  # Supplied by the host driver at run time (see shell-hook.sh), never by a wheel.
  driverLibs = [
    "libcuda.so.1"
    "libnvidia-ml.so.1"
  ];
  # Wheels whose libraries link the CUDA runtime wheels: let autoPatchelf find those in their own
  # store paths. [unverified offline: a networked build lists any soname still missing]
  cudaLinked = [
    "torch"
    "torchaudio"
    "torchvision"
    "sglang-kernel"
  ];
  linkCuda =
    name:
    prev.${name}.overrideAttrs (old: {
      autoPatchelfIgnoreMissingDeps = driverLibs;
      preFixup =
        (old.preFixup or "")
        + lib.concatMapStrings (n: "addAutoPatchelfSearchPath ${final.${n}}/${site}\n") cudaWheels;
    });
  # Runtime wheels link each other through $ORIGIN paths that span store paths; torch preloads
  # them from the virtualenv at import time.
  ignoreSiblings = name: prev.${name}.overrideAttrs (_: { autoPatchelfIgnoreMissingDeps = true; });
in
lib.genAttrs cudaWheels ignoreSiblings
// lib.genAttrs cudaLinked linkCuda
// {
  # SGLang after 0.5.9 is wheel-only: patch the installed tree, exactly as `repro patch apply`.
  sglang = prev.sglang.overrideAttrs (old: {
    postInstall = (old.postInstall or "") + ''
      PYTHONPATH=${patchSrc} ${python.interpreter} -S -c '
      import pathlib, sys
      from repro.patch import run
      run(pathlib.Path(sys.argv[1]), "apply")' "$out/${site}"
    '';
  });
}
