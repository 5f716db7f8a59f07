{
  description = "Stub pyproject.nix for offline evaluation (see nix/stubs/README.md)";
  inputs.nixpkgs.url = "github:NixOS/nixpkgs"; # always follows the root's nixpkgs
  outputs = _: { build.packages = import ./packages.nix; };
}
