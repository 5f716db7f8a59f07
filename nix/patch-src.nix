# The source the sglang build needs to apply the patch series with repro/patch.py (the one apply
# code path, shared with `repro patch apply`): that module, its imports, and the series directory.
# Evaluation fails when series and its directory disagree (an orphaned or a missing patch).
{
  lib,
  root,
  version,
}:
let
  series = "patches/sglang/${version}";
  dir = root + "/${series}";
  entry =
    l:
    let
      m = builtins.match "[[:space:]]*([^[:space:]]+)[[:space:]]*" l;
    in
    if m == null then
      throw "${series}/series: expected one file name per line, got `${l}`"
    else
      builtins.head m;
  isEntry = l: builtins.match "[[:space:]]*(#.*)?" l == null;
  lines = lib.splitString "\n" (builtins.readFile (dir + "/series"));
  listed = map entry (lib.filter isEntry lines);
  onDisk = lib.filter (lib.hasSuffix ".patch") (builtins.attrNames (builtins.readDir dir));
  orphans = lib.filter (f: !(builtins.elem f listed)) onDisk;
  missing = lib.filter (f: !(builtins.elem f onDisk)) listed;
  keep = [
    "repro"
    "repro/__init__.py"
    "repro/errors.py"
    "repro/files.py"
    "repro/patch.py"
    "patches"
    "patches/sglang"
  ];
  rel = path: lib.removePrefix "${toString root}/" (toString path);
in
if orphans != [ ] then
  throw "${series}/series: ${lib.concatStringsSep ", " orphans} not listed (every .patch must be)"
else if missing != [ ] then
  throw "${series}/series: lists ${lib.concatStringsSep ", " missing}, which do not exist"
else
  builtins.path {
    name = "repro-patch-sglang-${version}";
    path = root;
    filter = path: _: builtins.elem (rel path) keep || lib.hasPrefix series (rel path);
  }
