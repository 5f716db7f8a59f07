{
  description = "Stub build-system-pkgs for offline evaluation (see nix/stubs/README.md)";
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs"; # always follows the root's nixpkgs
    pyproject-nix.url = "github:pyproject-nix/pyproject.nix"; # likewise
    uv2nix.url = "github:pyproject-nix/uv2nix"; # likewise
  };
  outputs = _: {
    # The build backend of this repository's own package (pyproject.toml [build-system]).
    overlays.wheel = final: _prev: {
      setuptools = final.stdenv.mkDerivation {
        pname = "setuptools";
        version = "0";
      };
    };
  };
}
