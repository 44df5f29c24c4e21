"""What the benchmarks share: the tests' helpers for starting servers, the
command lines of the servers a run compares, and the JSON a run prints."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def fixtures():
    """tests/conftest.py as a module (ports, our command, the reference build)."""
    spec = importlib.util.spec_from_file_location("_bench_fixtures", REPO / "tests" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def server_argvs(fx, peers: str) -> dict[str, list[str]]:
    """{"ours": [...], "ours+metrics": [...], "reference": [...]} for the names in `peers`
    (comma separated); ours+metrics counts every command, its endpoint on a free
    loopback port."""
    argvs = {"ours": fx.our_server_argv(), "ours+metrics": fx.our_server_argv("--metrics", "127.0.0.1:0")}
    if "reference" in peers:
        ref = fx.reference_bin()
        if ref is None:
            raise SystemExit("reference build missing: run scripts/build-reference.sh")
        argvs["reference"] = [str(ref / "ggml-rpc-server")]
    return argvs


def emit_json(results, path: str | None) -> None:
    """Print a run's results as JSON, and write them to `path` too when one is given."""
    doc = json.dumps(results, indent=2)
    print(doc)
    if path:
        Path(path).write_text(doc + "\n")
