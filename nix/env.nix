# The environment of each SM target, shared by its devShell and its verify app: the arch lists
# from repro/data/stack.toml, the JIT toolchain, and shell-hook.sh (driver libraries, Triton cache).
{
  pkgs,
  stack,
  python,
  cuda,
}:
let
  inherit (pkgs) lib;
  # nvcc/ptxas, runtime headers and NVRTC for FlashInfer/Triton/torch JIT.
  cudaHome = pkgs.symlinkJoin {
    name = "cuda-home-${stack.stack.cuda}";
    paths = lib.concatMap (p: [
      (lib.getBin p)
      (lib.getDev p)
      (lib.getLib p)
    ]) [ cuda.cuda_nvcc cuda.cuda_cudart cuda.cuda_cccl cuda.cuda_nvrtc ];
  };
  cc = cuda.backendStdenv.cc; # a host compiler this nvcc accepts
in
builtins.mapAttrs (
  name: t:
  let
    vars = {
      REPRO_TARGET = name;
      REPRO_CAPABILITIES = lib.concatStringsSep " " t.capabilities;
      TORCH_CUDA_ARCH_LIST = t.torch-cuda-arch-list;
      FLASHINFER_CUDA_ARCH_LIST = t.flashinfer-cuda-arch-list;
      CC = "${cc}/bin/cc";
      CUDA_HOME = "${cudaHome}";
      TRITON_PTXAS_PATH = "${lib.getBin cuda.cuda_nvcc}/bin/ptxas"; # knows sm_103 (B300)
      # Triton compiles its launcher against Python.h at run time (the B300 failure).
      C_INCLUDE_PATH = "${python}/include/python${python.pythonVersion}";
      # Only these driver libraries are linked into the private dir (shell-hook.sh).
      REPRO_DRIVER_LIBS = lib.concatStringsSep " " [
        "libcuda.so*"
        "libnvidia-ml.so*"
        "libnvidia-ptxjitcompiler.so*"
        "libnvidia-nvvm.so*"
      ];
    };
    export = k: v: "export ${k}=${lib.escapeShellArg v}\n";
  in
  {
    inherit cudaHome cc vars;
    hook = ./shell-hook.sh;
    # Exported again by the shell hook and the apps: nixpkgs' setup hooks reset CC (and may set
    # CUDA variables) after the derivation's attributes are in the environment.
    exports = lib.concatStrings (lib.mapAttrsToList export vars);
  }
) stack.targets
