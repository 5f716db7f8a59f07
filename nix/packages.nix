# The Python stack per SM target: uv.lock's wheels built into one virtualenv by uv2nix, with the
# sglang wheel patched by the series in patches/sglang/<version>/ (nix/patch-src.nix).
{
  pkgs,
  stack,
  root,
  pyproject-nix,
  uv2nix,
  pyproject-build-systems,
}:
let
  inherit (pkgs) lib;
  dotless = sep: v: lib.replaceStrings [ "." ] [ sep ] v;
  python = pkgs."python${dotless "" stack.stack.python}"; # ships Python.h for Triton's JIT
  cuda = pkgs."cudaPackages_${dotless "_" stack.stack.cuda}";
  patchSrc = import ./patch-src.nix {
    inherit lib root;
    version = stack.stack.sglang;
  };
  workspace = uv2nix.lib.workspace.loadWorkspace { workspaceRoot = root; };
  pythonSet = (pkgs.callPackage pyproject-nix.build.packages { inherit python; }).overrideScope (
    lib.composeManyExtensions [
      pyproject-build-systems.overlays.wheel
      (workspace.mkPyprojectOverlay { sourcePreference = "wheel"; })
      (import ./overrides.nix { inherit lib python patchSrc; })
    ]
  );
  # The deployment stack plus the verify suite's tools, so `make verify` runs inside the shell.
  deps = workspace.deps.default // {
    k26-ddtree-repro = [
      "gpu"
      "dev"
    ];
  };
in
{
  inherit python cuda;
  venvs = builtins.mapAttrs (name: _: pythonSet.mkVirtualEnv "repro-${name}" deps) stack.targets;
  # The installed sglang tree with the series applied: `nix build .#sglang-patched` to inspect it.
  sglang-patched = pythonSet.sglang;
}
