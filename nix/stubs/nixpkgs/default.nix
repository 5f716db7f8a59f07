# Stub of `import nixpkgs { system; config; }`: the packages and builders this repository uses.
{
  system,
  config ? { },
  overlays ? [ ],
}:
let
  lib = import ./lib.nix;
  # A derivation that evaluates like a nixpkgs one (attributes, passthru, overrideAttrs) and
  # refuses to build.
  mkDerivation =
    args:
    let
      attrs = removeAttrs args [ "passthru" ];
      drv = builtins.derivation (
        attrs
        // {
          name = args.name or "${args.pname}-${args.version}";
          inherit system;
          builder = "/bin/sh";
          args = [
            "-c"
            "echo 'stub derivation: evaluation only' >&2; exit 1"
          ];
        }
      );
    in
    drv
    // (args.passthru or { })
    // {
      overrideAttrs = f: mkDerivation (args // (if builtins.isFunction f then f args else f));
    };
  pkg = name: mkDerivation { inherit name; };
  # CUDA is unfree: nixpkgs refuses it unless config.allowUnfree (the flake sets it).
  unfree =
    name:
    if config.allowUnfree or false then
      pkg name
    else
      throw "stub nixpkgs: ${name} has an unfree license; set config.allowUnfree";
  cc = pkg "gcc-wrapper";
  pkgs = {
    inherit lib;
    stdenv = {
      inherit mkDerivation cc;
    };
    callPackage =
      fn: args:
      let
        f = if builtins.isFunction fn then fn else import fn;
      in
      f (builtins.intersectAttrs (builtins.functionArgs f) pkgs // args);
    mkShell =
      args:
      mkDerivation (
        removeAttrs args [ "packages" ]
        // {
          name = args.name or "nix-shell";
          nativeBuildInputs = args.packages or [ ];
        }
      );
    symlinkJoin = { name, paths }: mkDerivation { inherit name paths; };
    writeShellApplication =
      {
        name,
        runtimeInputs,
        text,
      }:
      mkDerivation { inherit name runtimeInputs text; };
    runCommand =
      name: env: script:
      mkDerivation (env // { inherit name script; });
    ninja = pkg "ninja";
    nixfmt = pkg "nixfmt";
    python312 =
      let
        drv = pkg "python3-3.12";
      in
      drv
      // {
        pythonVersion = "3.12";
        sitePackages = "lib/python3.12/site-packages";
        interpreter = "${drv}/bin/python3.12";
      };
    cudaPackages_13_0 = {
      backendStdenv.cc = pkg "cuda-gcc-wrapper";
      cuda_nvcc = unfree "cuda_nvcc";
      cuda_cudart = unfree "cuda_cudart";
      cuda_cccl = unfree "cuda_cccl";
      cuda_nvrtc = unfree "cuda_nvrtc";
    };
  };
in
assert overlays == [ ];
pkgs
