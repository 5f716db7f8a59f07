{
  description = "Stub nixpkgs for offline evaluation (see nix/stubs/README.md)";
  outputs = _: { legacyPackages.x86_64-linux = import ./. { system = "x86_64-linux"; }; };
}
