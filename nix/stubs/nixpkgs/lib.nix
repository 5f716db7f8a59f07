# The few nixpkgs lib functions this repository's Nix code and the other stubs call.
let
  inherit (builtins)
    concatStringsSep
    filter
    foldl'
    listToAttrs
    map
    ;
  nameValuePair = name: value: { inherit name value; };
  extends =
    overlay: f: final:
    let
      prev = f final;
    in
    prev // overlay final prev;
  composeExtensions =
    f: g: final: prev:
    let
      fPrev = f final prev;
    in
    fPrev // g final (prev // fPrev);
  getOutput = out: drv: drv.${out} or drv;
in
{
  inherit
    concatStringsSep
    filter
    nameValuePair
    extends
    composeExtensions
    ;
  inherit (builtins) replaceStrings concatMap;
  fix =
    f:
    let
      x = f x;
    in
    x;
  composeManyExtensions = foldl' composeExtensions (_: _: { });
  # Separators here are plain characters (newline, space), which are their own regex.
  splitString = sep: s: filter builtins.isString (builtins.split sep s);
  hasPrefix = p: s: builtins.substring 0 (builtins.stringLength p) s == p;
  removePrefix =
    p: s:
    let
      n = builtins.stringLength p;
    in
    if builtins.substring 0 n s == p then builtins.substring n (builtins.stringLength s) s else s;
  hasSuffix =
    x: s:
    let
      n = builtins.stringLength s;
      m = builtins.stringLength x;
    in
    n >= m && builtins.substring (n - m) m s == x;
  genAttrs = names: f: listToAttrs (map (n: nameValuePair n (f n)) names);
  mapAttrs' = f: set: listToAttrs (map (n: f n set.${n}) (builtins.attrNames set));
  mapAttrsToList = f: set: map (n: f n set.${n}) (builtins.attrNames set);
  concatStrings = concatStringsSep "";
  concatMapStrings = f: l: concatStringsSep "" (map f l);
  escapeShellArg = s: "'${builtins.replaceStrings [ "'" ] [ "'\\''" ] s}'";
  getBin = getOutput "bin";
  getDev = getOutput "dev";
  getLib = getOutput "lib";
}
