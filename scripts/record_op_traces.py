"""Record the op cases of tests/interop/test_ops_vs_reference.py as sessions of a
reference ggml-rpc-server, one .trc file per case (ggmlrpc.trace's format), so that
the kernel family that reference was built for is checked bit for bit on any host
(tests/e2e/test_replay_ops.py replays them against our executor).

    GGMLRPC_REFERENCE_CPU=avx2 scripts/build-reference.sh         # ggml for AVX2
    python scripts/record_op_traces.py BIN_DIR x86-avx2 [CASE...]

writes tests/data/op-traces/x86-avx2/CASE.trc for every case given (default: the
products, attention, the ops on the family's vector primitives and the scalar loops
GCC compiles by its tuning, the larger ones left out unless named in ALWAYS; for a
"-zen" family, a build tuned for AMD Zen such as -march=znver3, only the last) and
drops the files of the cases not recorded.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.conftest import free_port, wait_port  # noqa: E402
from tests.interop import test_ops_vs_reference as ops  # noqa: E402
from tests.interop.test_models import Recorder  # noqa: E402

OUT = REPO / "tests" / "data" / "op-traces"
# the ops whose sums follow the family's kernels (its products, widths and exp)
PREFIXES = ("mul_mat", "fa-", "soft_max", "unary-", "glu-", "rms_norm", "norm", "l2_norm", "group_norm",
            "conv_2d", "out_prod", "hadamard", "sum", "rope")
MAX_BYTES = 24 << 10   # a default case whose session is larger is left out...
ALWAYS = ("mul_mat-BF16-prompt19x1", "mul_mat-Q8_0-prompt19x1", "mul_mat-IQ4_NL-prompt19x1",   # ...unless here
          "mul_mat-Q4_K-tiled", "mul_mat-Q6_K-3blocks-n9", "fa-7", "mul_mat_id-Q4_K-mixed",
          "mul_mat_id-Q4_0-mixed")


# the cases whose bytes depend on how GCC tuned the build (Zen tunings keep the
# multiply-add chains of these scalar loops unfused, others fuse them)
TUNED = ("solve_tri", "lightning_indexer", "lightning_indexer-f16", "lightning_indexer-q8_0", "dsv4_hc_pre",
         "dsv4_hc_pre-gated", "dsv4_hc_post", "mul_mat-Q2_0-3blocks-n1", "mul_mat-Q2_0-3blocks-n3",
         "mul_mat-Q2_0-3blocks-n9", "mul_mat-IQ4_NL-3blocks-n1", "mul_mat-MXFP4-3blocks-n1", "norm-strided")


def default_cases(family: str) -> list[str]:
    """A Zen-tuned family: the cases its tuning decides; else the ones of PREFIXES too."""
    if family.endswith("-zen"):
        return list(TUNED)
    return list(dict.fromkeys([n for n in ops.CASES if n.startswith(PREFIXES) and n not in ops.NOT_EXACT]
                              + list(TUNED)))


def record(bin_dir: Path, family: str, names: list[str], limit: int | None) -> None:
    out = OUT / family
    out.mkdir(parents=True, exist_ok=True)
    port = free_port()
    server = subprocess.Popen([str(bin_dir / "ggml-rpc-server"), "-p", str(port), "-t", str(ops.THREADS)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kept = set()
    try:
        wait_port(port, server)
        for name in names:
            with tempfile.TemporaryDirectory() as tmp:
                rec = Recorder(f"127.0.0.1:{port}", Path(tmp))
                try:
                    ops.run_case(rec.endpoint, ops.CASES[name], sum(map(ord, name)))
                finally:
                    rec.close()
                (trc,) = Path(tmp).glob("conn-*.trc")
                if limit is not None and trc.stat().st_size > limit and name not in ALWAYS + TUNED:
                    print(f"{name}: {trc.stat().st_size} bytes, left out")
                    continue
                (out / f"{name}.trc").write_bytes(trc.read_bytes())
                kept.add(f"{name}.trc")
    finally:
        server.terminate()
        server.wait(10)
    for old in out.glob("*.trc"):
        if old.name not in kept:
            old.unlink()
    total = sum(p.stat().st_size for p in out.glob("*.trc"))
    print(f"{len(kept)} sessions, {total} bytes in {out.relative_to(REPO)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("bin", type=Path, help="the reference build's bin directory")
    ap.add_argument("family", help="the kernel family it was built for (GGMLRPC_KERNELS names)")
    ap.add_argument("cases", nargs="*", help="case names (default: see above)")
    a = ap.parse_args(argv)
    unknown = [n for n in a.cases if n not in ops.CASES]
    if unknown:
        print(f"error: unknown cases: {', '.join(unknown)}", file=sys.stderr)
        return 2
    record(a.bin, a.family, a.cases or default_cases(a.family), None if a.cases else MAX_BYTES)
    return 0


if __name__ == "__main__":
    sys.exit(main())
