"""Long runs of the guard-page fuzzer (tests/guardfuzz.py) of the CPU planner and executor.

    python bench/fuzz.py --graphs 1000000 --seed 1 --jobs 2
    python bench/fuzz.py --graphs 200000 --seed 7 --ops MUL_MAT,GET_ROWS --threads 3
    python bench/fuzz.py --seed 7 --replay 123456        # one graph, in this process

Graph i of seed S is always the same graph, so a run splits into --jobs workers over
disjoint index ranges and any failure is replayed by its index. Each worker runs its
graphs in forked children (a fault or a hang costs the child, which is reported with
its reproducer, and a fresh child goes on). Prints progress, then a table and a JSON
document with the counts (run, rejected by the planner, too big for the guard slots,
stopped by a run-time check, refused by the work limit) and the rate. Asserts nothing;
the exit status is 1 when any graph faulted, wrote beside a tensor or hung.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.append(str(REPO))   # the tests package; ggmlrpc itself as installed

from tests import guardfuzz  # noqa: E402


def _ops(names):
    if not names:
        return None
    from ggmlrpc.ggml import GGMLOp
    return {GGMLOp[n.strip().upper()] for n in names.split(",")}


def _worker(args):
    seed, start, n, threads, ops, hang_s, deadline, big, chains, job, queue = args

    def chunk(counts):
        queue.put(("progress", job, counts))

    def failure(f):
        queue.put(("failure", job, str(f)))

    counts, failures = guardfuzz.fuzz(seed, n, start, threads, ops, hang_s, on_failure=failure,
                                      stop_at_failure=False, deadline=deadline, chunk=50 if big else 5000,
                                      on_chunk=chunk, big=big, chains=chains)
    queue.put(("done", job, counts))
    return len(failures)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--graphs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--start", type=int, default=0, help="first graph index")
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0,
                    help="executor threads per graph (0: 1, 2 or 3, picked per graph)")
    ap.add_argument("--ops", default="", help="comma-separated op names (default: every seeded op)")
    ap.add_argument("--hang", type=float, default=guardfuzz.HANG_S, help="seconds before a graph is a hang")
    ap.add_argument("--minutes", type=float, default=0, help="stop after this long (0: no limit)")
    ap.add_argument("--big", action="store_true",
                    help="one dim of every graph past 2^31 over stride 0 (seconds per graph)")
    ap.add_argument("--chains", action="store_true",
                    help="multi-node graphs: outputs reused, viewed, or partly overwritten by later nodes")
    ap.add_argument("--replay", type=int, default=None, help="run graph INDEX in this process")
    ap.add_argument("--json", default="", help="also write the JSON to this file")
    a = ap.parse_args(argv)
    ops = _ops(a.ops)
    if a.replay is not None:
        print(guardfuzz.replay(a.seed, a.replay, a.threads or None, ops, big=a.big, chains=a.chains))
        return 0
    deadline = time.monotonic() + a.minutes * 60 if a.minutes else None
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Manager().Queue()
    per = -(-a.graphs // a.jobs)
    jobs = [(a.seed, a.start + j * per, min(per, a.graphs - j * per), a.threads or None, ops, a.hang,
             deadline, a.big, a.chains, j, queue)
            for j in range(a.jobs) if a.graphs - j * per > 0]
    t0 = time.monotonic()
    latest = {}
    failures = []
    with ctx.Pool(len(jobs)) as pool:
        res = pool.map_async(_worker, jobs)
        done = 0
        while done < len(jobs):
            kind, job, body = queue.get()
            if kind == "failure":
                failures.append(body)
                print(f"FAILURE (seed {a.seed}) {body}", flush=True)
                continue
            latest[job] = body
            done += kind == "done"
            total = sum(c["graphs"] for c in latest.values())
            dt = time.monotonic() - t0
            print(f"{total} graphs in {dt:.0f} s ({total / dt:.0f}/s), {len(failures)} failures", flush=True)
        res.get()
    dt = time.monotonic() - t0
    counts = {k: sum(c.get(k, 0) for c in latest.values()) for k in ("graphs",) + guardfuzz._KINDS}
    out = dict(seed=a.seed, start=a.start, jobs=a.jobs, threads=a.threads, big=a.big, chains=a.chains, seconds=round(dt, 1),
               rate=round(counts["graphs"] / dt, 1), failures=failures, **counts)
    print(f"\n{'graphs':>10} {'run':>10} {'rejected':>10} {'over work':>9} {'too big':>8} {'run err':>8} "
          f"{'rate/s':>8} {'faults':>6}")
    print(f"{counts['graphs']:>10} {counts['run']:>10} {counts['rejected']:>10} {counts['over_work']:>9} "
          f"{counts['too_big']:>8} {counts['run_error']:>8} {out['rate']:>8} {len(failures):>6}")
    print(json.dumps(out))
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=1) + "\n")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
