# `nix flake check`: the gate that needs no GPU. Each check names what it guards.
{
  pkgs,
  venv,
  sglang-patched,
  src,
}:
let
  inSource =
    name: script:
    pkgs.runCommand "repro-check-${name}" { nativeBuildInputs = [ venv ]; } ''
      cp -r ${src} src && chmod -R u+w src && cd src
      export HOME=$TMPDIR HYPOTHESIS_PROFILE=ci
      ${script}
      touch $out
    '';
in
{
  # The series applies, in order, to the pinned sglang wheel (uv.lock's hash).
  inherit sglang-patched;
  # The CPU tier of the verify suite on the locked stack (the nix tier needs nix itself).
  cpu-tier = inSource "cpu-tier" ''
    python -m pytest verify/cpu -q -p no:cacheprovider --benchmark-skip -m 'not nix'
  '';
  # The golden tensors match their manifest hashes.
  golden = inSource "golden" "repro golden check";
  # The lint gate of `make test`: ruff at uv.lock's version with pyproject's rules (select = ALL).
  ruff = inSource "ruff" "ruff check --no-cache repro verify";
}
