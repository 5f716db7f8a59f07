# Stub of uv2nix's `lib.workspace.loadWorkspace`: reads the real pyproject.toml and uv.lock and
# gives one stub package per locked package, carrying its extras.
{ workspaceRoot }:
let
  project = (builtins.fromTOML (builtins.readFile (workspaceRoot + "/pyproject.toml"))).project;
  lock = builtins.fromTOML (builtins.readFile (workspaceRoot + "/uv.lock"));
  package = final: p: {
    name = p.name;
    value = final.stdenv.mkDerivation {
      pname = p.name;
      inherit (p) version;
      passthru.extras = builtins.attrNames (p.optional-dependencies or { });
    };
  };
in
{
  deps.default = {
    ${project.name} = [ ];
  };
  mkPyprojectOverlay =
    { sourcePreference }:
    final: _prev: builtins.listToAttrs (map (package final) lock.package);
}
