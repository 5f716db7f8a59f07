{
  description = "k26-ddtree-repro: the pinned DDTree/SGLang stack, one devShell per SM target";

  inputs = {
    # Toolchain only (python312 with headers, cc, ninja, cudaPackages_13_0); the Python stack is
    # the hash-pinned wheel set of uv.lock.
    nixpkgs.url = "github:NixOS/nixpkgs/nixos-26.05";
    pyproject-nix = {
      url = "github:pyproject-nix/pyproject.nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    uv2nix = {
      url = "github:pyproject-nix/uv2nix";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
    pyproject-build-systems = {
      url = "github:pyproject-nix/build-system-pkgs";
      inputs.pyproject-nix.follows = "pyproject-nix";
      inputs.uv2nix.follows = "uv2nix";
      inputs.nixpkgs.follows = "nixpkgs";
    };
  };

  outputs =
    {
      self,
      nixpkgs,
      pyproject-nix,
      uv2nix,
      pyproject-build-systems,
    }:
    let
      system = "x86_64-linux";
      stack = builtins.fromTOML (builtins.readFile ./repro/data/stack.toml);
      # The CUDA toolkit is unfree; nothing is built from source with CUDA, so no cudaSupport.
      pkgs = import nixpkgs {
        inherit system;
        config.allowUnfree = true;
      };
      py = import ./nix/packages.nix {
        inherit pkgs stack pyproject-nix uv2nix pyproject-build-systems;
        root = ./.;
      };
      envs = import ./nix/env.nix {
        inherit pkgs stack;
        inherit (py) python cuda;
      };
      default = stack.default-target;
    in
    {
      packages.${system} = py.venvs // {
        inherit (py) sglang-patched;
        default = py.venvs.${default};
      };
      devShells.${system} = import ./nix/shells.nix {
        inherit pkgs envs default;
        inherit (py) venvs;
      };
      checks.${system} = import ./nix/checks.nix {
        inherit pkgs;
        inherit (py) sglang-patched;
        venv = py.venvs.${default};
        src = self;
      };
      apps.${system} = import ./nix/apps.nix {
        inherit pkgs envs default;
        inherit (py) venvs;
      };
      formatter.${system} = pkgs.nixfmt;
    };
}
