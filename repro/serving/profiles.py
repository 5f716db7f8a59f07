"""Deployment profiles (`repro/data/profiles.toml`); their thresholds are :mod:`repro.serving.thresholds`.

A profile names one SGLang deployment: models, SM target, parallelism, speculative algorithm and
the threshold set its benchmarks are judged against. Loading validates every key; a mistake is one
line naming the file, the profile, the key, what was expected and what was found. Profile names
become file names (server logs), so they are checked like one; floats must be finite.

A profile's ``sglang`` table cannot undo what the package decides: SGLang's argparse accepts any
unambiguous abbreviation (``--hos`` is ``--host``) and keeps the last value given, so a key that
equals or abbreviates a flag the package sets (:data:`OWNED_SERVER_ARGS`) or one that picks an
address, opens another listener or reads more flags from a file (:data:`NETWORK_SERVER_ARGS`) is
refused, spelled with or without leading dashes and with ``_`` or ``-``. Values that SGLang would
read as a flag (``"--host"``) are refused too, as are ``env`` variables that set an address or
port.
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from repro.algorithms import ALGORITHMS, budgeted, drafts
from repro.errors import UsageError
from repro.files import check_name, is_finite_number, read_toml
from repro.schedule import BudgetSchedule
from repro.serving.table import Table, data_file, packaged
from repro.serving.thresholds import load_thresholds
from repro.stack.pins import Target, load_stack

INTERCONNECTS = ("nvlink", "pcie", "mixed", "single")
TOKENIZERS = ("model", "none")
MOE_A2A_BACKENDS = ("none", "deepep", "mooncake", "nixl", "mori", "flashinfer", "megamoe")
# Server arguments a profile sets through its own keys (flag -> key; "" for --host, which is always
# 127.0.0.1), never through its `sglang` table: every flag repro.serving.sglang_server.server_argv writes,
# with SGLang 0.5.17's aliases of them.
OWNED_SERVER_ARGS = {
    "model-path": "model", "model": "model", "speculative-draft-model-path": "drafter",
    "speculative-draft-model": "drafter", "tp-size": "tp", "tensor-parallel-size": "tp",
    "ep-size": "ep", "expert-parallel-size": "ep", "ep": "ep", "moe-a2a-backend": "moe-a2a-backend",
    "speculative-algorithm": "algorithm", "speculative-ddtree-budget": "budget",
    "speculative-ddtree-budget-schedule": "budget-schedule",
    "attention-backend": "attention-backend",
    "speculative-draft-attention-backend": "draft-attention-backend",
    "cuda-graph-bs-decode": "cuda-graph-bs", "cuda-graph-backend-decode": "cuda-graph-bs",
    "skip-tokenizer-init": "tokenizer", "load-format": "load-format",
    "speculative-draft-load-format": "load-format", "host": "", "port": "port",
}
# SGLang 0.5.17 flags that choose an address, open another listener or read flags from a file.
NETWORK_SERVER_ARGS = (
    "config", "dist-init-addr", "nccl-init-addr", "nnodes", "node-rank", "grpc-mode",
    "smg-grpc-mode", "grpc-port", "grpc-http-sidecar-port", "smg-http-sidecar-port", "sidecar",
    "kv-events-config", "decoupled-spec-bind-endpoint", "disaggregation-bootstrap-port",
    "encoder-urls", "encoder-register-urls", "encoder-bootstrap-port", "engine-info-bootstrap-port",
    "remote-instance-weight-loader-seed-instance-ip",
    "remote-instance-weight-loader-seed-instance-service-port",
    "remote-instance-weight-loader-send-weights-group-ports", "otlp-traces-endpoint",
)
_SGLANG_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]*$")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_NETWORK_ENV = re.compile(r"(^|_)(IP|PORT|ADDR|ENDPOINT|URL|GRPC)(_|$)")
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
MODELS_DIR_ENV = "REPRO_MODELS_DIR"


@dataclass(frozen=True)
class Profile:
    """One validated deployment profile (field names are the TOML keys with `_` for `-`)."""

    name: str
    model: str
    target: str
    tp: int
    algorithm: str
    thresholds: str
    attention_backend: str
    draft_attention_backend: str
    description: str = ""
    machine: str = ""
    interconnect: str = "nvlink"
    drafter: str | None = None
    ep: int = 1
    moe_a2a_backend: str = "none"
    budget: int | None = None
    budget_schedule: str | None = None  # DDTREE's budget per batch size (repro.schedule's text), instead of budget
    cuda_graph_bs: tuple[int, ...] = ()
    cuda_graph_max_tokens: int | None = None
    tokenizer: str = "model"
    load_format: str = "auto"
    port: int = 30000
    start_timeout: float = 900.0
    launch_module: str = "sglang.launch_server"
    sglang: dict[str, Any] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # "{models}" stands for the models directory

    @property
    def label(self) -> str:
        """Algorithm with its budget or schedule, e.g. ``DDTREE B=32``, ``DDTREE S=1:63,16:15``."""
        if not budgeted(self.algorithm):
            return self.algorithm
        return f"{self.algorithm} S={self.budget_schedule}" if self.budget_schedule else f"{self.algorithm} B={self.budget}"

    @property
    def schedule(self) -> BudgetSchedule | None:
        """DDTREE's budget per batch size (a fixed budget B is ``1:B``); None for AR and DFLASH."""
        if not budgeted(self.algorithm):
            return None
        if self.budget_schedule:
            return BudgetSchedule.parse(self.budget_schedule)
        return None if self.budget is None else BudgetSchedule.fixed(self.budget)

    @property
    def graph_bs(self) -> tuple[int, ...]:
        """The decode CUDA-graph batch sizes captured: ``cuda-graph-bs`` up to where a DDTREE
        verify's bs x (B(bs) + 1) tokens pass ``cuda-graph-max-tokens``; larger batches run eager."""
        schedule = self.schedule
        if self.cuda_graph_max_tokens is None or schedule is None:
            return self.cuda_graph_bs
        return tuple(b for b in self.cuda_graph_bs if b * (schedule.budget(b) + 1) <= self.cuda_graph_max_tokens)

    def with_algorithm(self, algorithm: str, budget: int | None = None, schedule: str | None = None) -> Profile:
        """The same deployment running another algorithm (a budget or a schedule only for DDTREE;
        neither: the profile's own)."""
        algorithm = algorithm.upper()
        if algorithm not in ALGORITHMS:
            msg = f"algorithm must be one of {', '.join(ALGORITHMS)} (got {algorithm!r})"
            raise UsageError(msg)
        if drafts(algorithm) and not self.drafter:
            msg = f"profile {self.name!r}: {algorithm} needs a 'drafter' key (none set)"
            raise UsageError(msg)
        if not budgeted(algorithm):
            return dataclasses.replace(self, algorithm=algorithm, budget=None, budget_schedule=None)
        if schedule is not None:
            try:
                text = BudgetSchedule.parse(schedule).text
            except ValueError as exc:
                msg = f"DDTREE budget schedule: {exc}"
                raise UsageError(msg) from None
            return dataclasses.replace(self, algorithm=algorithm, budget=None, budget_schedule=text)
        if budget is None and self.budget_schedule:
            return dataclasses.replace(self, algorithm=algorithm)
        budget = self.budget if budget is None else budget
        if budget is None or budget < 0:
            msg = f"DDTREE budget must be an integer >= 0 (got {budget!r})"
            raise UsageError(msg)
        return dataclasses.replace(self, algorithm=algorithm, budget=budget, budget_schedule=None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready form, the inverse of :meth:`from_dict`."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Any, where: str = "profile") -> Profile:
        """Rebuild a profile stored by :meth:`to_dict` (e.g. in a results file), validated as a
        profiles.toml table is; a UsageError naming ``where`` otherwise."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            msg = f"{where}: must be a stored profile with a string 'name' (got {data!r:.80})"
            raise UsageError(msg)
        table = {k.replace("_", "-"): list(v) if isinstance(v, tuple) else v
                 for k, v in data.items() if k != "name" and v is not None}
        return _profile(data["name"], table, where, _stack_targets(), None)


def _stack_targets() -> dict[str, Target]:
    """The SM targets of ``stack.toml`` (the attention-backend defaults come from there)."""
    try:
        return load_stack().targets
    except (OSError, ValueError) as exc:
        msg = f"stack.toml: {exc}"
        raise UsageError(msg) from None


PROFILE_KEYS = {
    "description", "target", "machine", "interconnect", "model", "drafter", "tp", "ep",
    "moe-a2a-backend", "algorithm", "budget", "budget-schedule", "attention-backend", "draft-attention-backend",
    "cuda-graph-bs", "cuda-graph-max-tokens", "tokenizer", "load-format", "port", "start-timeout",
    "thresholds", "sglang", "launch-module", "env",
}


def reserved_flag(key: str) -> str | None:
    """The owned or network SGLang flag that ``--key`` would set or abbreviate, else None."""
    bare = key.lstrip("-").replace("_", "-")
    return next((f for f in (*OWNED_SERVER_ARGS, *NETWORK_SERVER_ARGS) if f.startswith(bare)), None)


def _check_sglang(t: Table, sglang: dict[str, Any]) -> None:
    """Every ``sglang`` key is a plain flag name the package does not own; values are no flags."""
    scalar = (str, int, float, bool)
    for key, value in sglang.items():
        where = f"sglang.{key}"
        flag = reserved_flag(key) if key.strip("-_") else None
        if flag in OWNED_SERVER_ARGS:
            owner = OWNED_SERVER_ARGS[flag]
            how = f"set it with the profile key '{owner}'" if owner else "always to 127.0.0.1"
            t.fail(where, f"sets or abbreviates --{flag}, which repro sets itself ({how})")
        if flag is not None:
            t.fail(where, f"sets or abbreviates --{flag}, which could listen or connect beyond "
                          f"127.0.0.1 (not allowed in a profile)")
        if not _SGLANG_KEY.match(key):
            t.fail(where, "must be an SGLang flag name without leading dashes "
                          "(letters, digits, '-' and '_')")
        values = value if isinstance(value, list) else [value]
        if not isinstance(value, (*scalar, list)) or not all(isinstance(v, scalar) for v in values):
            t.fail(where, f"must be a string, number, boolean or list (got {value!r})")
        for v in values:
            if isinstance(v, float) and not is_finite_number(v):
                t.fail(where, f"must be a finite number (got {v!r})")
            if isinstance(v, str) and v.startswith("-") and not _is_number(v):
                t.fail(where, f"value {v!r} starts with '-', so SGLang would read it as a flag")


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def _check_env(t: Table, env: dict[str, Any]) -> None:
    for key, value in env.items():
        if not _ENV_KEY.match(key):
            t.fail(f"env.{key}", "must be an environment variable name (letters, digits, '_')")
        if _NETWORK_ENV.search(key.upper()):
            t.fail(f"env.{key}", "sets an address or port, which could reach beyond 127.0.0.1 "
                                 "(not allowed in a profile)")
        if not isinstance(value, str):
            t.fail(f"env.{key}", f"must be a string (got {value!r})")


def _profile(name: str, data: dict[str, Any], where: str, targets: dict[str, Target],  # noqa: C901 - a check per key
             threshold_sets: set[str] | None) -> Profile:
    check_name(name, f"{where}: profile name")
    t = Table(f"{where}: profile '{name}'", data, PROFILE_KEYS)
    target = t.choice("target", tuple(targets), required=True)
    tp = t.positive_int("tp", required=True)
    ep = t.positive_int("ep", default=1)
    if tp % ep:
        t.fail("ep", f"must divide tp={tp} (got {ep})")
    a2a = t.choice("moe-a2a-backend", MOE_A2A_BACKENDS, default="none")
    if a2a == "deepep" and ep != tp:
        t.fail("ep", f"must equal tp={tp} with moe-a2a-backend deepep (got {ep})")
    algorithm = t.choice("algorithm", ALGORITHMS, required=True)
    budget = t.get("budget", int)
    schedule = _schedule(t)
    if budgeted(algorithm) and (budget is None) == (schedule is None):
        t.fail("budget", f"or 'budget-schedule' (one of them) is required when algorithm is {algorithm}")
    if budget is not None and budget < 0:
        t.fail("budget", f"must be an integer >= 0 (got {budget})")
    drafter = t.get("drafter", str)
    if drafts(algorithm) and not drafter:
        t.fail("drafter", f"is required when algorithm is {algorithm}")
    graph_bs = t.get("cuda-graph-bs", list, default=[])
    if any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in graph_bs) or \
            graph_bs != sorted(set(graph_bs)):
        t.fail("cuda-graph-bs", f"must be ascending distinct integers >= 1 (got {graph_bs!r})")
    graph_tokens = t.positive_int("cuda-graph-max-tokens")
    thresholds = t.get("thresholds", str, required=True)
    if threshold_sets is not None and thresholds not in threshold_sets:
        t.fail("thresholds", f"must name a [sets.*] table of thresholds.toml "
                             f"({', '.join(sorted(threshold_sets))}) (got {thresholds!r})")
    port = t.get("port", int, default=30000)
    if not 1 <= port <= 65535:
        t.fail("port", f"must be in 1..65535 (got {port})")
    start_timeout = t.get("start-timeout", (int, float), default=900)
    if start_timeout <= 0:
        t.fail("start-timeout", f"must be > 0 seconds (got {start_timeout})")
    sglang = t.get("sglang", dict, default={})
    _check_sglang(t, sglang)
    env = t.get("env", dict, default={})
    _check_env(t, env)
    launch_module = t.get("launch-module", str, "sglang.launch_server")
    if not _MODULE.match(launch_module):
        t.fail("launch-module", f"must be a dotted Python module name (got {launch_module!r})")
    defaults = targets[target]
    return Profile(
        name=name, model=t.get("model", str, required=True), target=target, tp=tp,
        algorithm=algorithm, thresholds=thresholds,
        attention_backend=t.get("attention-backend", str, defaults.attention_backend),
        draft_attention_backend=t.get("draft-attention-backend", str,
                                      defaults.draft_attention_backend),
        description=t.get("description", str, ""), machine=t.get("machine", str, ""),
        interconnect=t.choice("interconnect", INTERCONNECTS, default="nvlink"),
        drafter=drafter, ep=ep, moe_a2a_backend=a2a,
        budget=budget if budgeted(algorithm) else None,
        budget_schedule=schedule.text if budgeted(algorithm) and schedule is not None else None,
        cuda_graph_bs=tuple(graph_bs),
        cuda_graph_max_tokens=graph_tokens,
        tokenizer=t.choice("tokenizer", TOKENIZERS, default="model"),
        load_format=t.get("load-format", str, "auto"), port=port,
        start_timeout=float(start_timeout), launch_module=launch_module,
        sglang=dict(sglang), env=dict(env),
    )


def _schedule(t: Table) -> BudgetSchedule | None:
    """The ``budget-schedule`` key: a table ``{ 1 = 63, 16 = 15 }`` or its text ``"1:63,16:15"``."""
    value = t.get("budget-schedule", (dict, str))
    if value is None:
        return None
    try:
        return BudgetSchedule.from_mapping(value) if isinstance(value, dict) else BudgetSchedule.parse(value)
    except ValueError as exc:
        t.fail("budget-schedule", f"is not a budget schedule: {exc}")
    return None


def load_profiles(path: str | Path | None = None,
                  thresholds_path: str | Path | None = None) -> dict[str, Profile]:
    """Every profile of ``path`` (default: the packaged ``profiles.toml``), validated."""
    data = read_toml(Path(path), "--profile-file") if path else packaged("profiles.toml")
    path = Path(path) if path else data_file("profiles.toml")
    top = Table(str(path), data, {"profiles"})
    tables = top.get("profiles", dict, required=True)
    sets = set(load_thresholds(thresholds_path))
    targets = _stack_targets()
    profiles = {}
    for name, table in tables.items():
        if not isinstance(table, dict):
            top.fail(f"profiles.{name}", f"must be a table (got {table!r})")
        profiles[name] = _profile(name, table, str(path), targets, sets)
    return profiles


def get_profile(name: str, path: str | Path | None = None) -> Profile:
    """One profile by name; an unknown name lists the known ones."""
    profiles = load_profiles(path)
    if name not in profiles:
        msg = f"PROFILE must be one of {', '.join(profiles)} (got {name!r})"
        raise UsageError(msg)
    return profiles[name]


def models_dir(arg: str | Path | None = None) -> Path:
    """The models directory: ``arg``, else ``$REPRO_MODELS_DIR``, else ``./models``."""
    return Path(arg or os.environ.get(MODELS_DIR_ENV) or "models")


def model_path(value: str, root: Path) -> Path:
    """A profile's model/drafter value as a path: absolute as given, else under ``root``."""
    path = Path(value).expanduser()
    return path if path.is_absolute() else root / path
