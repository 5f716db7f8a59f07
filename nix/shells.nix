# One devShell per SM target (mapAttrs over stack.toml's targets) plus `default`.
{
  pkgs,
  envs,
  venvs,
  default,
}:
let
  shell =
    name: env:
    pkgs.mkShell (
      env.vars
      // {
        name = "repro-${name}";
        packages = [
          venvs.${name}
          env.cc
          env.cudaHome
          pkgs.ninja
        ];
        shellHook = env.exports + "source ${env.hook}\n";
      }
    );
  shells = builtins.mapAttrs shell envs;
in
shells // { default = shells.${default}; }
