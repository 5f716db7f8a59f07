"""The drafter test hook's profiles against the figures they were fitted to, by exact simulation.

    python -m verify.bench.fit_hook_profile                       # every profile with a [fit] table
    python -m verify.bench.fit_hook_profile paper-qwen3-8b-math500 --rounds 4000
    python -m verify.bench.fit_hook_profile NAME --fit            # re-fit its `free` parameters
    python -m verify.bench.fit_hook_profile --write                # record drafter_profiles_fit.json

Each round is one (root, prefix length) draw of the hook (``DrafterTestHook``); its τ is
``verify.bench.hook_law.round_lengths``: DFLASH's 1 + the leading depths whose row argmax is the
correct token, DDTREE's ``repro.ddtree.walk`` over ``repro.ddtree.build_trees(rows, B)``, the
rows over the ranked tokens alone (τ does not depend on the vocabulary; ``test_hook_law`` checks
it against the full rows at Qwen3's). τ is the mean over the rounds; the draws' roots lie in a
small vocabulary (VOCAB). ``--fit`` minimises the summed squared log-ratios of τ to the
targets over the profile's ``fit.free`` parameters (Nelder-Mead from the TOML values, on
``--fit-rounds`` rounds) and prints them for the TOML. Exit 1 when a τ misses its tolerance.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from typing import Any

import torch

from repro.drafter_hook.hook import DrafterTestHook
from repro.drafter_hook.profiles import PROFILES_PATH, load_profiles
from verify.bench.hook_law import round_lengths

VOCAB = 48
"""The simulation's vocabulary: ranks (32) + 2 at least; τ is the same at any larger V."""
FIT_JSON = PROFILES_PATH.with_name("drafter_profiles_fit.json")
ROUNDS = 4000  # the recorded sample
CHECK_ROUNDS = 1000  # its first rounds, which the CPU tier re-simulates ...
CHECK_DFLASH_ROUNDS = 4000  # ... and all of them for DFLASH, which builds no trees
CHUNK = 500  # rounds per tree build (bounds the build's memory)


def draws(n: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(roots [n], prefix lengths [n]) of the fixed sample: distinct prefix lengths, spread roots."""
    i = torch.arange(n, dtype=torch.int64)
    return (i * 40503 + 7) % vocab, 11 + 7 * i


def successor(vocab: int) -> list[int]:
    """A fixed planted successor table (acceptance does not depend on which)."""
    return [(5 * t + 3) % vocab for t in range(vocab)]


def hook_for(profile: dict[str, Any], *, name: str, vocab: int = VOCAB) -> DrafterTestHook:
    """The hook of ``profile`` at its fitted block size on the fixed successor table."""
    horizon = int(profile["fit"]["block"]) - 1
    return DrafterTestHook.build(successor(vocab), profile, horizon=horizon, name=name, where=name)


def dflash_lengths(hook: DrafterTestHook, roots: torch.Tensor, prefix_lens: torch.Tensor) -> torch.Tensor:
    """[n] τ of DFLASH's chain (each row's argmax) per round."""
    return round_lengths(hook, roots, prefix_lens, None)


def ddtree_lengths(hook: DrafterTestHook, roots: torch.Tensor, prefix_lens: torch.Tensor, budget: int) -> torch.Tensor:
    """[n] τ of DDTREE at ``budget`` per round: repro.ddtree's tree and walk over the hook's rows."""
    return torch.cat([round_lengths(hook, roots[lo : lo + CHUNK], prefix_lens[lo : lo + CHUNK], budget)
                      for lo in range(0, roots.shape[0], CHUNK)])


def taus(hook: DrafterTestHook, rounds: int, budgets: list[int], *, dflash_rounds: int | None = None) -> dict[str, float]:
    """Mean τ over the first ``rounds`` draws (DFLASH: ``dflash_rounds``, default the same):
    "dflash" and one entry per budget."""
    roots, prefix_lens = draws(dflash_rounds or rounds, hook.vocab_size)
    res = {"dflash": dflash_lengths(hook, roots, prefix_lens).double().mean().item()}
    roots, prefix_lens = roots[:rounds], prefix_lens[:rounds]
    for b in budgets:
        res[str(b)] = ddtree_lengths(hook, roots, prefix_lens, b).double().mean().item()
    return res


def targets(profile: dict[str, Any]) -> dict[str, float]:
    """The fit's τ targets: "dflash" and the DDTREE budgets (as strings)."""
    fit = profile["fit"]
    return {"dflash": float(fit["dflash"])} | {str(b): float(t) for b, t in fit.get("ddtree", {}).items()}


def budgets_of(profile: dict[str, Any]) -> list[int]:
    """The budgets the profile is fitted at, else (informational) 16..512, each with the budget
    one below it (informational): B + 1 = a power of two fills the verify's row tiles, so on a
    dense target B 63 verifies up to 13% cheaper than B 64 (docs/PERFORMANCE.md) for τ within
    about 1%, and ``repro.tuning.bound`` weighs both."""
    fitted = sorted(int(b) for b in profile["fit"].get("ddtree", {})) or [16, 32, 64, 128, 256, 512]
    return sorted({*fitted, *(b - 1 for b in fitted if b > 1)})


def misses(achieved: dict[str, float], want: dict[str, float], tolerance: float) -> list[str]:
    """The targets whose achieved τ is off by more than ``tolerance`` (relative)."""
    return [k for k, t in want.items() if abs(achieved[k] / t - 1) > tolerance]


def table(name: str, achieved: dict[str, float], want: dict[str, float], tolerance: float) -> str:
    """The achieved τ against the targets, one line per algorithm/budget."""
    lines = [f"{name}:  {'':>10} {'target':>7} {'tau':>7} {'ratio':>6}"]
    for key, tau in achieved.items():
        label = "DFLASH" if key == "dflash" else f"DDTREE B{key}"
        if key in want:
            ok = "ok" if abs(tau / want[key] - 1) <= tolerance else f"off by more than {tolerance:.0%}"
            lines.append(f"  {label:>16} {want[key]:7.2f} {tau:7.2f} {tau / want[key]:6.3f}  {ok}")
        else:
            lines.append(f"  {label:>16} {'-':>7} {tau:7.2f}")
    return "\n".join(lines)


# ---- the fit --------------------------------------------------------------------------------


def _get(profile: dict[str, Any], path: str) -> float:
    node: Any = profile
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return float(node)


def _set(profile: dict[str, Any], path: str, value: float) -> None:
    *head, last = path.split(".")
    node: Any = profile
    for part in head:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(last) if isinstance(node, list) else last] = value


def _is_probability(path: str) -> bool:
    return path.rsplit(".", 1)[-1] in ("miss", "stay", "miss_off")


def fit(profile: dict[str, Any], *, name: str, rounds: int, max_evals: int) -> dict[str, float]:
    """The ``fit.free`` parameters minimising sum(log(tau / target)^2) on ``rounds`` rounds."""
    from scipy.optimize import minimize

    free = list(profile["fit"]["free"])
    want, budgets = targets(profile), sorted(int(b) for b in profile["fit"].get("ddtree", {}))
    # search space: log-odds for probabilities, log for weights (both unbounded)
    to_x = lambda p, v: math.log(v / (1 - v)) if _is_probability(p) else math.log(v)  # noqa: E731
    from_x = lambda p, x: 1 / (1 + math.exp(-x)) if _is_probability(p) else math.exp(x)  # noqa: E731
    trial = copy.deepcopy(profile)
    best = [math.inf]

    def loss(x: list[float]) -> float:
        for p, v in zip(free, x, strict=True):
            _set(trial, p, round(from_x(p, v), 4))
        got = taus(hook_for(trial, name=name), rounds, budgets)
        value = sum(math.log(got[k] / t) ** 2 for k, t in want.items())
        if value < best[0]:  # progress on stderr: a fit takes minutes
            best[0] = value
            params = {p: _get(trial, p) for p in free}
            print(f"  {value:.5f} {json.dumps(params)} {json.dumps({k: round(v, 2) for k, v in got.items()})}",
                  file=sys.stderr, flush=True)
        return value

    x0 = [to_x(p, _get(profile, p)) for p in free]
    simplex = [x0] + [[v + (0.3 if i == j else 0.0) for i, v in enumerate(x0)] for j in range(len(x0))]
    best = minimize(loss, x0, method="Nelder-Mead", options={"maxfev": max_evals, "initial_simplex": simplex}).x
    return {p: round(from_x(p, v), 4) for p, v in zip(free, best, strict=True)}


def main(argv: list[str] | None = None) -> int:
    """Print (and with --write record) each profile's τ against its targets; --fit re-fits."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="profiles (default: every profile with a [fit] table)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds simulated (default {ROUNDS})")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--fit", action="store_true", help="re-fit the fit.free parameters first and print them")
    parser.add_argument("--fit-rounds", type=int, default=500, help="rounds per evaluation of the fit (default 500)")
    parser.add_argument("--max-evals", type=int, default=200, help="fit evaluations (default 200)")
    mode.add_argument("--write", action="store_true", help=f"record {FIT_JSON.name} (the CPU tier checks it)")
    args = parser.parse_args(argv)
    profiles = load_profiles()
    names = args.names or [n for n, p in profiles.items() if "fit" in p]
    unknown = [n for n in names if "fit" not in profiles.get(n, {})]
    if unknown:
        print(f"fit_hook_profile: no profile with a [fit] table named {', '.join(unknown)}", file=sys.stderr)
        return 2
    record: dict[str, Any] = {"command": "python -m verify.bench.fit_hook_profile --write", "vocab": VOCAB, "profiles": {}}
    failed = False
    for name in names:
        profile = profiles[name]
        if args.fit:
            params = fit(profile, name=name, rounds=args.fit_rounds, max_evals=args.max_evals)
            print(f"{name}: fitted {json.dumps(params)}")
            for p, v in params.items():
                _set(profile, p, v)
        hook, want, tol = hook_for(profile, name=name), targets(profile), float(profile["fit"]["tolerance"])
        achieved = taus(hook, args.rounds, budgets_of(profile))
        check = taus(hook, CHECK_ROUNDS, budgets_of(profile), dflash_rounds=CHECK_DFLASH_ROUNDS)
        print(table(f"{name} ({args.rounds} rounds)", achieved, want, tol))
        print(table(f"{name} (the CPU check: DFLASH {CHECK_DFLASH_ROUNDS} rounds, DDTREE the first {CHECK_ROUNDS})",
                    check, want, tol))
        failed |= bool(misses(achieved, want, tol) or misses(check, want, tol))
        record["profiles"][name] = {
            "block": int(profile["fit"]["block"]), "tolerance": tol, "targets": want,
            "sample": {"rounds": args.rounds, "tau": achieved},
            "check": {"rounds": CHECK_ROUNDS, "dflash_rounds": CHECK_DFLASH_ROUNDS, "tau": check},
        }
    if args.write:
        FIT_JSON.write_text(json.dumps(record, indent=2) + "\n")
        print(f"wrote {FIT_JSON}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
