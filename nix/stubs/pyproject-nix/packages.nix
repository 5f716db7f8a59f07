# Stub of pyproject.nix's `build.packages`: a Python package scope with overrideScope and
# mkVirtualEnv. mkVirtualEnv checks that each requested package and extra exists in the scope.
{
  lib,
  stdenv,
  python,
}:
let
  base = final: {
    inherit python stdenv;
    mkVirtualEnv =
      name: spec:
      stdenv.mkDerivation {
        inherit name;
        packages = lib.mapAttrsToList (
          pname: extras:
          let
            p = final.${pname};
            missing = lib.filter (e: !(builtins.elem e p.extras)) extras;
          in
          if missing == [ ] then
            p
          else
            throw "mkVirtualEnv ${name}: ${pname} has no extra ${lib.concatStringsSep ", " missing}"
        ) spec;
      };
  };
  scope =
    overlay:
    lib.fix (lib.extends overlay base)
    // {
      overrideScope = o: scope (lib.composeExtensions overlay o);
    };
in
scope (_: _: { })
