# `nix run .#verify` (default target) and `.#verify-<sm>`: `repro doctor` then the verify suite,
# inside the target's environment, from the current checkout.
{
  pkgs,
  envs,
  venvs,
  default,
}:
let
  inherit (pkgs) lib;
  app =
    name: env:
    let
      script = pkgs.writeShellApplication {
        name = "repro-verify-${name}";
        runtimeInputs = [
          venvs.${name}
          env.cc
          env.cudaHome
        ];
        text = ''
          ${env.exports}
          # shellcheck source=/dev/null
          source ${env.hook}
          repro doctor --target ${name}
          exec python -m pytest verify --benchmark-skip -q "$@"
        '';
      };
    in
    {
      type = "app";
      program = "${script}/bin/repro-verify-${name}";
    };
  apps = lib.mapAttrs' (name: env: lib.nameValuePair "verify-${name}" (app name env)) envs;
in
apps // { verify = apps."verify-${default}"; }
