"""`ggml-rpc-cli`: the user-facing commands of the main host.

    ggml-rpc-cli probe host:port[,host:port...]
    ggml-rpc-cli run -m model.gguf [--rpc host:port,...] [-ngl N] -p PROMPT -n N ...
    ggml-rpc-cli bench -m model.gguf [--rpc host:port,...] -p 64 -n 32 -r 3
    ggml-rpc-cli chat -m model.gguf [--rpc host:port,...] [-sys PROMPT] ...
    ggml-rpc-cli serve -m model.gguf [--rpc host:port,...] [--host H] [--port P] ...

Errors are one line on stderr and exit status 1, never a traceback.
"""
from __future__ import annotations

import argparse
import sys
import time

from ..errors import GgmlRpcError, VersionMismatch
from .common import CliError, split_endpoints

MiB = 1024 * 1024




# -- probe -------------------------------------------------------------------

def probe_endpoint(endpoint: str, timeout: float, rounds: int = 5, speed: bool = False) -> dict:
    """What a server says about itself, and the best of `rounds` round trips (ms);
    with `speed`, each device's speed at a Q8_0 matrix-vector product (GB/s of
    weights, as -sm auto measures it)."""
    from ..client import RemoteBackend

    try:
        rb = RemoteBackend(endpoint, timeout=timeout)
    except VersionMismatch as e:
        raise CliError(f"{endpoint}: {e}") from None
    except GgmlRpcError as e:
        raise CliError(f"{endpoint}: server unreachable ({e})") from None
    try:
        info = {"endpoint": endpoint, "version": ".".join(map(str, rb.version)), "devices": []}
        for dev in range(rb.device_count()):
            free, total = rb.get_device_memory(dev)
            info["devices"].append({"index": dev, "free": free, "total": total,
                                    "alignment": rb.get_alignment(dev),
                                    "max_size": rb.get_max_size(dev)})
        rtts = []
        for _ in range(rounds):
            t0 = time.perf_counter()
            rb.ping()
            rtts.append((time.perf_counter() - t0) * 1e3)
        info["rtt_ms"] = min(rtts)
        if speed:
            from ..ggml import GGMLType
            from ..llm.autosplit import BENCH_BYTES, measure
            from ..llm.placement import Device
            for d in info["devices"]:
                m = measure(Device(rb, d["index"], endpoint, d["free"]), GGMLType.Q8_0)
                d["q8_0_matvec_gb_s"] = round(m.bytes_per_ms / 1e6, 2)
            info["speed_bytes"] = BENCH_BYTES
        return info
    except GgmlRpcError as e:
        raise CliError(f"{endpoint}: connection lost during probe ({e})") from None
    finally:
        rb.close()


def format_probe(info: dict) -> str:
    lines = [f"{info['endpoint']}: RPC v{info['version']}, "
             f"{len(info['devices'])} device(s), round trip {info['rtt_ms']:.3f} ms"]
    for d in info["devices"]:
        max_size = "unlimited" if d["max_size"] >= (1 << 63) else f"{d['max_size'] // MiB} MiB"
        lines.append(f"  device {d['index']}: {d['total'] // MiB} MiB total, {d['free'] // MiB} MiB free, "
                     f"alignment {d['alignment']}, max buffer {max_size}")
        if "q8_0_matvec_gb_s" in d:
            lines[-1] += f", Q8_0 mat-vec {d['q8_0_matvec_gb_s']:.2f} GB/s"
    return "\n".join(lines)


def cmd_probe(a) -> int:
    status = 0
    for ep in split_endpoints(a.endpoints):
        try:
            info = probe_endpoint(ep, a.timeout, speed=a.speed)
        except CliError as e:
            print(f"error: {e}", file=sys.stderr)
            status = 1
            continue
        if a.json:
            import json
            print(json.dumps(info))
        else:
            print(format_probe(info), flush=True)
    return status


# -- entry -------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="ggml-rpc-cli", description="ggml RPC main host")
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("probe", help="ask RPC servers about their devices")
    p.add_argument("endpoints", help="host:port[,host:port...]")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each server (default 5)")
    p.add_argument("--json", action="store_true", help="one JSON object per server")
    p.add_argument("--speed", action="store_true",
                   help="also time each device at a Q8_0 matrix-vector product over 64 MiB (what -sm auto measures)")
    p.set_defaults(func=cmd_probe)
    from . import chat, run, serve
    run.add_parsers(sub)
    chat.add_parser(sub)
    serve.add_parsers(sub)
    return ap


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    try:
        return a.func(a)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # run as `python -m`: the subcommands import this module by its name, so its
    # CliError must be that module's, not this __main__ copy's
    from ggmlrpc.cli.main import main as _main
    sys.exit(_main())
