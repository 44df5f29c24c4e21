"""Every kernel file compiles with nvcc for sm_90 and sm_80: no errors or warnings, no
register spills, static shared memory within 48 KiB. Skipped without nvcc; results
are cached by content hash (a cold run compiles each file once for both archs)."""
from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from ggmlrpc.cuda import FAMILIES, KERNEL_DIR

from .conftest import simt

ARCHS = ("sm_90", "sm_80")
SMEM_LIMIT = 48 * 1024
NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not on PATH")

_ENTRY = re.compile(r"Compiling entry function '(\w+)' for '(sm_\d+)'")


def parse_ptxas(log: str) -> dict[tuple[str, str], dict]:
    """{(kernel, arch): {registers, spill_stores, spill_loads, stack, smem}} from -Xptxas -v."""
    out, cur = {}, None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = out.setdefault((m.group(1), m.group(2)), {"smem": 0})
            continue
        if cur is None:
            continue
        m = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m:
            cur["stack"], cur["spill_stores"], cur["spill_loads"] = map(int, m.groups())
        m = re.search(r"Used (\d+) registers", line)
        if m:
            cur["registers"] = int(m.group(1))
            s = re.search(r"(\d+) bytes smem", line)
            cur["smem"] = int(s.group(1)) if s else 0
    return out


def compile_family(family: str) -> dict:
    src = (KERNEL_DIR / f"{family}.cu").read_text()
    common = (KERNEL_DIR / "common.cuh").read_text()
    version = subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout
    key = hashlib.sha256("\0".join([src, common, version, *ARCHS]).encode()).hexdigest()[:24]
    cached = simt.cache_dir() / f"nvcc-{family}-{key}.json"
    if cached.exists():
        return json.loads(cached.read_text())
    cmd = [NVCC, *[f"-gencode=arch=compute_{a[3:]},code={a}" for a in ARCHS], "-Xptxas", "-v", "-c",
           "-o", "/dev/null", "-I", str(KERNEL_DIR), str(KERNEL_DIR / f"{family}.cu")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    res = {"rc": r.returncode, "log": r.stdout + r.stderr,
           "kernels": {f"{k}@{a}": v for (k, a), v in parse_ptxas(r.stdout + r.stderr).items()}}
    if r.returncode == 0:
        cached.write_text(json.dumps(res))
    return res


@pytest.fixture(scope="module")
def results():
    with ThreadPoolExecutor(2) as pool:
        return dict(zip(FAMILIES, pool.map(compile_family, FAMILIES)))


@pytest.mark.parametrize("family", FAMILIES)
def test_nvcc(results, family):
    res = results[family]
    assert res["rc"] == 0, res["log"][-3000:]
    problems = [l for l in res["log"].splitlines() if re.search(r"\b(error|warning)\b", l, re.I)]
    assert not problems, "\n".join(problems[:20])
    kernels = res["kernels"]
    assert {k.split("@")[1] for k in kernels} == set(ARCHS)
    for name, info in kernels.items():
        assert info["spill_stores"] == 0 and info["spill_loads"] == 0, f"{name} spills: {info}"
        assert info["smem"] <= SMEM_LIMIT, f"{name} uses {info['smem']} bytes of static shared memory"
    worst = max(kernels.items(), key=lambda kv: kv[1]["registers"])
    print(f"\n{family}: {len(kernels)} kernel builds, most registers {worst[1]['registers']} ({worst[0]}), "
          f"most smem {max(v['smem'] for v in kernels.values())} B, "
          f"most stack {max(v['stack'] for v in kernels.values())} B")


def test_parse_ptxas():
    log = """ptxas info    : Compiling entry function 'k1' for 'sm_90'
ptxas info    : Function properties for k1
    16 bytes stack frame, 4 bytes spill stores, 8 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 8448 bytes smem, 400 bytes cmem[0]
"""
    assert parse_ptxas(log) == {("k1", "sm_90"): {"smem": 8448, "stack": 16, "spill_stores": 4, "spill_loads": 8,
                                                  "registers": 255}}
