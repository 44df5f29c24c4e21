"""What one cache store costs as the cache grows: the index's share.

    python bench/cache_index.py                   # 2,000 stores of 4 KiB
    python bench/cache_index.py --stores 5000 --size 65536 --json out.json

TensorCache.store() is timed directly (no server, no network) for distinct
payloads into an empty cache directory; beside it, the same bytes written as a plain
file, which is all llama.cpp's server does per store (it keeps no index). The
median time of the first 100 stores is compared with that of stores 1,500 to 1,600
(or the last 100): an index rewritten per store grows with the file count, a
journaled one does not. Prints a table and a JSON document; asserts nothing.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time

from ggmlrpc import protocol
from ggmlrpc.cache import TensorCache


def timed_stores(directory: str, payloads, plain: bool) -> list[float]:
    cache = None if plain else TensorCache(directory, max_files=None)
    codec = protocol.codec()
    out = []
    for data in payloads:
        h = codec.fnv1a(data)
        t0 = time.perf_counter()
        if plain:
            with open(os.path.join(directory, f"{h:016x}"), "wb") as f:
                f.write(data)
        else:
            cache.store(h, data)
        out.append(time.perf_counter() - t0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stores", type=int, default=2000)
    ap.add_argument("--size", type=int, default=4096, help="bytes per payload")
    ap.add_argument("--json", help="also write the JSON document here")
    args = ap.parse_args()
    payloads = [os.urandom(args.size) for _ in range(args.stores)]
    late = slice(1500, 1600) if args.stores >= 1600 else slice(args.stores - 100, args.stores)
    doc = {"stores": args.stores, "size": args.size, "late_window": [late.start, late.stop]}
    for name, plain in (("ggmlrpc", False), ("plain file (llama.cpp)", True)):
        with tempfile.TemporaryDirectory() as d:
            times = timed_stores(d, payloads, plain)
        doc[name] = {"first_100_ms": statistics.median(times[:100]) * 1e3,
                     "late_100_ms": statistics.median(times[late]) * 1e3,
                     "total_s": sum(times)}
    print(json.dumps(doc, indent=1))
    print(f"\n{'':24}{'first 100':>12}{'stores ' + str(late.start) + '+':>14}{'ratio':>8}")
    for name in ("ggmlrpc", "plain file (llama.cpp)"):
        r = doc[name]
        print(f"{name:24}{r['first_100_ms']:10.3f}ms{r['late_100_ms']:12.3f}ms"
              f"{r['late_100_ms'] / r['first_100_ms']:7.1f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
