"""Start and stop real SGLang servers on 127.0.0.1 for the end-to-end tier, and talk to them.

Not a test module: the e2e tests import it. A server's log goes to ``$REPRO_E2E_OUT`` (default
a temporary directory) as ``srv_<name>.log``. Requests carry ``input_ids`` (servers run with
``--skip-tokenizer-init`` unless they serve the model's tokenizer) and use no proxy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager, suppress
from pathlib import Path

READY = "fired up and ready to roll"
# Flags every e2e server shares: small memory, triton attention, no tokenizer, local only.
COMMON = [
    "--host", "127.0.0.1", "--skip-tokenizer-init", "--attention-backend", "triton",
    "--sampling-backend", "pytorch", "--grammar-backend", "none", "--mem-fraction-static", "0.15",
    "--max-running-requests", "4", "--max-total-tokens", "32768", "--context-length", "4096",
    "--random-seed", "0", "--watchdog-timeout", "120", "--disable-radix-cache",
    "--cuda-graph-backend-prefill", "disabled",
]
GRAPHS = {True: ["--cuda-graph-backend-decode", "full", "--cuda-graph-max-bs-decode", "4"],
          False: ["--cuda-graph-backend-decode", "disabled"]}


def out_dir() -> Path:
    """Where server logs and result JSON go."""
    path = Path(os.environ.get("REPRO_E2E_OUT") or tempfile.mkdtemp(prefix="repro-e2e-"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def server_args(model: Path, *, algo: str | None = None, drafter: Path | None = None,
                budget: int | None = None, graphs: bool = True, overlap: bool = True,
                tokenizer: bool = False) -> list[str]:
    """The launch flags of one configuration (AR when ``algo`` is None); ``tokenizer`` serves
    with the model's own tokenizer (text in and out) instead of ``--skip-tokenizer-init``."""
    common = [a for a in COMMON if not (tokenizer and a == "--skip-tokenizer-init")]
    args = ["--model-path", str(model), *common, *GRAPHS[graphs]]
    if not overlap:
        args.append("--disable-overlap-schedule")
    if algo is not None:
        args += ["--speculative-algorithm", algo, "--speculative-draft-model-path", str(drafter)]
    if budget is not None:
        args += ["--speculative-ddtree-budget", str(budget)]
    return args


@contextmanager
def server(name: str, args: list[str], *, port: int, env: dict[str, str] | None = None, timeout: float = 300):
    """A running ``sglang.launch_server``; yields its base URL and kills its process group after."""
    log_path = out_dir() / f"srv_{name}.log"
    full_env = {**os.environ, "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost",
                "PYTHONUNBUFFERED": "1", **(env or {})}
    with log_path.open("w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "sglang.launch_server", *args, "--port", str(port)],
                                stdout=log, stderr=subprocess.STDOUT, env=full_env, start_new_session=True)
    t0 = time.time()
    try:
        while READY not in log_path.read_text(errors="replace"):
            if proc.poll() is not None or time.time() - t0 > timeout:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-30:])
                msg = f"server {name} did not start (rc={proc.poll()}):\n{tail}"
                raise RuntimeError(msg)
            time.sleep(1)
        print(f"[e2e] {name} ready after {time.time() - t0:.0f}s", flush=True)
        yield f"http://127.0.0.1:{port}"
    finally:
        _stop(proc)


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass
    with suppress(ProcessLookupError):  # children left in the group after the leader exited
        os.killpg(proc.pid, signal.SIGKILL)


def generate(url: str, input_ids, sampling_params: dict, timeout: float = 300, extra: dict | None = None):
    """POST /generate with token ids (one prompt or a list); returns the JSON response."""
    payload = {"input_ids": input_ids, "sampling_params": sampling_params, **(extra or {})}
    body = json.dumps(payload).encode()
    req = urllib.request.Request(f"{url}/generate", data=body, headers={"Content-Type": "application/json"})  # noqa: S310 - our server's http URL
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    with opener.open(req, timeout=timeout) as resp:
        return json.loads(resp.read())


def save(name: str, data) -> None:
    """Write ``data`` as ``<out>/<name>.json``."""
    (out_dir() / f"{name}.json").write_text(json.dumps(data))
