{
  description = "Stub uv2nix for offline evaluation (see nix/stubs/README.md)";
  inputs = {
    nixpkgs.url = "github:NixOS/nixpkgs"; # always follows the root's nixpkgs
    pyproject-nix.url = "github:pyproject-nix/pyproject.nix"; # likewise
  };
  outputs = _: { lib.workspace.loadWorkspace = import ./workspace.nix; };
}
