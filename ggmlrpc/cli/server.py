"""`ggml-rpc-server`: llama.cpp's RPC server command, same options and banner."""
from __future__ import annotations

import gc
import ipaddress
import logging
import os
import signal
import sys
import threading

from ..cache import DEFAULT_MAX_FILES, TensorCache, cache_directory
from ..devices import select_devices, split_names
from ..errors import DeviceError
from ..metrics import Metrics, parse_endpoint
from ..server import CLIENT_RESERVE, MEM_MARGIN, Limits, Server

MiB = 1024 * 1024
UNLIMITED = 1 << 64  # a size limit that nothing reaches


def default_threads() -> int:
    return max(1, (os.cpu_count() or 1) // 2)


def usage(prog: str) -> str:
    return (f"Usage: {prog} [options]\n\n"
            "options:\n"
            "  -h, --help                       show this help message and exit\n"
            f"  -t, --threads N                  number of threads for the CPU device (default: {default_threads()})\n"
            "  -d, --device <dev1,dev2,...>     comma-separated list of devices\n"
            "  -H, --host HOST                  host to bind to (default: 127.0.0.1)\n"
            "  -p, --port PORT                  port to bind to (default: 50052)\n"
            "  -c, --cache                      enable local file cache\n"
            "\n"
            "ggmlrpc options (llama.cpp's server has none of these):\n"
            "      --cache-preload FILE         fill the cache from a local GGUF model (repeatable; implies -c)\n"
            "      --cache-readonly             serve only preloaded cache files, store no uploads (implies -c);\n"
            "                                   use this when clients do not trust each other\n"
            "      --cache-max-size SIZE        cap the disk space of the cache files, least recently used uploads\n"
            "                                   evicted (implies -c)\n"
            f"      --cache-max-files N          cap the number of cache files, the same way (default: {DEFAULT_MAX_FILES}; implies -c)\n"
            f"      --max-clients N              connections served at once, more are refused (default: {Limits.max_clients})\n"
            f"      --max-per-address N          of those, from one address (default: {Limits.max_per_address})\n"
            f"      --hello-timeout SECONDS      time a new connection has to complete HELLO (default: {Limits.hello_timeout:g})\n"
            "      --idle-timeout SECONDS       close a connection silent for this long (default: never)\n"
            f"      --max-buffers N              live buffers per connection (default: {Limits.max_buffers})\n"
            "      --mem-limit SIZE             buffer bytes per device, all clients together\n"
            f"                                   (default: the device's free memory at start less {MEM_MARGIN}%)\n"
            "      --client-mem-limit SIZE      of those, what one connection may hold, buffers and graph scratch\n"
            f"                                   (default: --mem-limit less 1/{CLIENT_RESERVE}, kept for the others;\n"
            "                                   0: all of --mem-limit)\n"
            "      --max-graph-work N           refuse a graph whose estimated work is over N units per byte of\n"
            "                                   the buffers it uses (a unit: about one multiply-add of a matrix\n"
            f"                                   product); 0: no limit (default: {Limits.max_graph_work})\n"
            "      --peers                      let clients link this server to other ggmlrpc servers they name,\n"
            "                                   which then swap -sm row results directly (off by default)\n"
            "      --metrics [HOST:]PORT        serve Prometheus metrics at http://HOST:PORT/metrics\n"
            "                                   (default: off; HOST defaults to 127.0.0.1)\n"
            "      --sched-normal               run under the default scheduling policy; by default the server\n"
            "                                   runs as a batch job (Linux SCHED_BATCH: same CPU share, but a\n"
            "                                   woken server thread does not preempt another program's)\n"
            "  SIZE: bytes, or a number with K, M, G or T (powers of 1024)\n")


class Params:
    host = "127.0.0.1"
    port = 50052
    threads = None
    devices: list[str]
    cache = False
    metrics: tuple[str, int] | None = None
    cache_readonly = False
    cache_max_size: int | None = None
    cache_max_files: int | None = DEFAULT_MAX_FILES
    preload: list[str]
    sched_batch = True

    def __init__(self):
        self.devices = []
        self.preload = []
        self.limits = Limits()


class UsageError(Exception):
    pass


_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "4096", "512M", "1.5G", "24GiB" (K/M/G/T are powers of 1024)."""
    t = text.strip().upper().removesuffix("B").removesuffix("I")
    unit = t[-1:] if t[-1:] in "KMGT" and t[-1:] else ""
    num = t[:-1] if unit else t
    try:
        value = float(num) if "." in num else int(num)
    except ValueError:
        raise UsageError(f"error: invalid size: {text}") from None
    if value < 0:
        raise UsageError(f"error: invalid size: {text}")
    return int(value * _UNITS[unit])


def positive_int(opt: str, v: str) -> int:
    try:
        n = int(v)
    except ValueError:
        n = 0
    if n <= 0:
        raise UsageError(f"error: {opt} needs a positive integer: {v}")
    return n


def int_in(v: str, lo: int, hi: int | None, what: str) -> int:
    """An integer from lo to hi (no bound above when None); else `error: invalid <what>`
    with the text given, or the number read where it is out of range (as llama.cpp's
    rpc-server says of threads)."""
    try:
        n = int(v)
    except ValueError:
        raise UsageError(f"error: invalid {what}: {v}") from None
    if n < lo or (hi is not None and n > hi):
        raise UsageError(f"error: invalid {what}: {n}")
    return n


def seconds(opt: str, v: str) -> float | None:
    """Seconds > 0; 0 turns the timeout off."""
    try:
        x = float(v)
    except ValueError:
        x = -1.0
    if not x >= 0 or x == float("inf"):
        raise UsageError(f"error: {opt} needs seconds (0: no timeout): {v}")
    return x or None


def parse(argv: list[str], prog: str) -> Params:
    """llama.cpp's parser: short and long names, each value in the next argument."""
    p = Params()
    it = iter(argv)
    for arg in it:
        def value():
            try:
                return next(it)
            except StopIteration:
                raise UsageError(f"error: missing value for {arg}") from None
        if arg in ("-H", "--host"):
            p.host = value()
        elif arg in ("-p", "--port"):
            p.port = int_in(value(), 1, 65535, "port")
        elif arg in ("-t", "--threads"):
            p.threads = int_in(value(), 1, None, "number of threads")
        elif arg in ("-d", "--device"):
            p.devices.extend(split_names(value()))
        elif arg in ("-c", "--cache"):
            p.cache = True
        elif arg == "--metrics":
            try:
                p.metrics = parse_endpoint(value())
            except ValueError as e:
                raise UsageError(f"error: {e}") from None
        elif arg == "--cache-preload":
            p.preload.append(value())
            p.cache = True
        elif arg == "--cache-readonly":
            p.cache = p.cache_readonly = True
        elif arg == "--cache-max-size":
            p.cache_max_size = parse_size(value())
            p.cache = True
        elif arg == "--cache-max-files":
            p.cache_max_files = positive_int(arg, value())
            p.cache = True
        elif arg == "--max-clients":
            p.limits.max_clients = positive_int(arg, value())
        elif arg == "--max-per-address":
            p.limits.max_per_address = positive_int(arg, value())
        elif arg == "--max-buffers":
            p.limits.max_buffers = positive_int(arg, value())
        elif arg == "--hello-timeout":
            p.limits.hello_timeout = seconds(arg, value())
        elif arg == "--idle-timeout":
            p.limits.idle_timeout = seconds(arg, value())
        elif arg == "--mem-limit":
            p.limits.mem_limit = parse_size(value())
        elif arg == "--client-mem-limit":   # 0: a connection may hold all of --mem-limit
            p.limits.client_mem_limit = parse_size(value()) or UNLIMITED
        elif arg == "--peers":
            p.limits.peers = True
        elif arg == "--sched-normal":
            p.sched_batch = False
        elif arg == "--max-graph-work":
            v = value()
            p.limits.max_graph_work = None if v.strip() == "0" else positive_int(arg, v)
        elif arg in ("-h", "--help"):
            sys.stderr.write(usage(prog) + "\n")
            raise SystemExit(0)
        else:
            raise UsageError(f"error: unknown argument: {arg}")
    return p


def host_warning(host: str, what: str = "RPC server") -> str:
    bang = "!" * 59
    return (f"\n{bang}\n"
            f"WARNING: Host ('{host}') is != '127.0.0.1'\n"
            f"         Never expose the {what} to an open network!\n"
            "         This is an experimental feature and is not secure!\n"
            f"{bang}\n\n")


def device_line(dev) -> str:
    free, total = dev.memory()
    return f"  {dev.name}: {dev.description} ({total // MiB} MiB, {free // MiB} MiB free)"


def banner(endpoint: str, cache_dir: str | None, devices, metrics: str | None = None) -> str:
    lines = ["Starting RPC server v7.0.0",
             f"  endpoint       : {endpoint}",
             f"  local cache    : {cache_dir or 'n/a'}"]
    if metrics:  # only with --metrics: the default banner stays llama.cpp's
        lines.append(f"  metrics        : {metrics}")
    lines.append("Devices:")
    lines += [device_line(d) for d in devices]
    lines.append("  transport      : TCP")
    return "\n".join(lines)


def batch_sched() -> None:
    """Run this thread, and every thread it starts, as a batch job (Linux SCHED_BATCH):
    the same share of the CPU, but a thread that wakes up (a request came) waits for the
    running one to yield or use its turn instead of preempting it. On a machine the
    server shares with the host, the host's work between two servers' steps (read one
    answer, send the next request) is then not cut off by the server it has just woken:
    measured on a 2-core host with two pinned servers, four requests at once through
    `serve` got 4% more tokens/s (Q8_0) and 5% (Q4_K_M). Not on Linux: nothing."""
    if not (hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_BATCH")):
        return
    try:      # the threads that imports started (a BLAS pool's) too, not only this one
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        try:
            os.sched_setscheduler(tid, os.SCHED_BATCH, os.sched_param(0))
        except OSError as e:      # gone, or a sandbox forbids it: the default policy there
            logging.getLogger(__name__).debug("SCHED_BATCH refused for thread %d: %s", tid, e)


def quiet_collector() -> None:
    """Keep Python's cycle collector from pausing every session for tens of milliseconds.

    A full collection stops all threads while it walks every tracked object, and a
    server that has imported NumPy and friends holds a few hundred thousand of them:
    decoding one large graph (tens of thousands of tensors) set off full collections
    of 40 to 90 ms, during which no other client was answered. What exists once the
    server is up lives as long as the process, so it is moved out of the collector's
    sight (gc.freeze): a full collection then walks only what sessions hold."""
    gc.collect()
    gc.freeze()


def main(argv: list[str] | None = None) -> int:
    prog = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "ggml-rpc-server"
    argv = sys.argv[1:] if argv is None else argv
    try:
        params = parse(argv, prog)
    except UsageError as e:
        sys.stderr.write(f"{e}\n{usage(prog)}\nInvalid parameters\n")
        return 1
    logging.basicConfig(level=logging.DEBUG if "GGML_RPC_DEBUG" in os.environ else logging.INFO,
                        format="%(message)s", stream=sys.stderr)
    if params.sched_batch:     # before any thread starts: they inherit it
        batch_sched()
    if params.host != "127.0.0.1":  # llama.cpp warns first, whatever the host
        sys.stderr.write(host_warning(params.host))
    try:
        ipaddress.IPv4Address(params.host)
    except ValueError:
        sys.stderr.write(f"error: host must be a numeric IPv4 address: {params.host}\n")
        return 1
    if params.metrics and params.metrics[0] != "127.0.0.1":
        sys.stderr.write(host_warning(params.metrics[0], "metrics endpoint"))

    try:
        devices = select_devices(params.devices, params.threads or default_threads())
    except DeviceError as e:
        sys.stderr.write(f"error: {e.args[0]}\navailable devices:\n")
        for d in e.args[1]:
            sys.stderr.write(device_line(d) + "\n")
        sys.stderr.write("No devices found\n")  # llama.cpp's last word here as well
        return 1
    if not devices:
        sys.stderr.write("No devices found\n")
        return 1
    if any(d.name == "CPU" for d in devices):
        from ..compute.cpu import select_kernel_family
        try:
            family = select_kernel_family()
        except DeviceError as e:
            sys.stderr.write(f"error: {e}\n")
            return 1
        logging.getLogger(__name__).debug("CPU kernels reproduce ggml's %s build", family)

    cache_dir = cache = None
    if params.cache:
        cache_dir = cache_directory()
        try:
            os.makedirs(cache_dir, exist_ok=True)
        except OSError:
            sys.stderr.write(f"Failed to create cache directory: {cache_dir}\n")
            return 1
        cache = TensorCache(cache_dir, readonly=params.cache_readonly,
                            max_size=params.cache_max_size, max_files=params.cache_max_files)
        for path in params.preload:
            try:
                n, size = cache.preload(path)
            except (OSError, ValueError) as e:
                sys.stderr.write(f"error: cannot preload {path}: {e}\n")
                return 1
            sys.stderr.write(f"preloaded {n} tensors ({size // MiB} MiB) from {path}\n")

    endpoint = f"{params.host}:{params.port}"
    server = Server(devices, params.host, params.port, cache=cache, limits=params.limits)
    metrics_url = None
    if params.metrics:
        server.metrics = Metrics(server)
        try:
            port = server.metrics.serve(*params.metrics)
        except OSError as e:
            sys.stderr.write(f"Failed to create metrics socket: {e}\n")
            return 1
        metrics_url = f"http://{params.metrics[0]}:{port}/metrics"
    print(banner(endpoint, cache_dir, devices, metrics_url), flush=True)
    try:
        server.bind()
    except OSError as e:
        sys.stderr.write(f"Failed to create server socket: {e}\n")
        return 1

    stop = threading.Event()

    def on_signal(signum, frame):
        stop.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    quiet_collector()
    worker = threading.Thread(target=server.serve_forever, daemon=True, name="rpc-accept")
    worker.start()
    while not stop.wait(0.5):
        if not worker.is_alive():
            return 1
    server.close(timeout=1.0)  # a signal ends the process within about a second
    if server.metrics is not None:
        server.metrics.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
