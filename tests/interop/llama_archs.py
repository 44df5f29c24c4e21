"""llama.cpp's test-llama-archs run against an RPC server, one architecture per fresh server.

test-llama-archs (from the reference build) makes a small random model of each
architecture llama.cpp knows (dense and MoE variants), runs it on a backend and on
ggml's own CPU backend and compares the logits (NMSE <= 1e-4), then saves the model,
loads it back and checks the logits are unchanged. The server is registered as
backend RPC0 by the same LD_PRELOAD shim test-backend-ops uses (backend_ops.py).

llama.cpp's client aborts the whole program when a server closes its connection, so
each architecture runs against its own server process: a refused graph ends only
that architecture.

    python -m tests.interop.llama_archs                     # every architecture, both servers
    python -m tests.interop.llama_archs --ours jamba lfm2   # some, our server only
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from tests.interop.backend_ops import Result, add_side_args, print_table, run_client

# The architectures test-llama-archs runs a configuration of (the ones it marks
# unsupported, and the ones it leaves out, print SKIP and count no test).
ARCHS = """
llama llama4 deci falcon baichuan grok gpt2 gptneox mpt starcoder refact bloom stablelm
qwen qwen2 qwen2moe qwen2vl qwen3 qwen3moe qwen3next qwen3vl qwen3vlmoe qwen35 qwen35moe
qwen4exp phi2 phi3 phimoe plamo plamo2 plamo3 codeshell orion internlm2 minicpm minicpm3
gemma gemma2 gemma3 gemma3n starcoder2 mamba mamba2 maple jamba falcon-h1 xverse
command-r cohere2 cohere2moe dbrx olmo olmo2 olmoe muse-glimmer openelm arctic deepseek
deepseek2 deepseek32 deepseek4 chatglm glm4 glm4moe glm-dsa bitnet t5 jais jais2
nemotron nemotron_h nemotron_h_moe exaone exaone4 exaone-moe granite granitemoe
granitehybrid granite_swa bailingmoe bailingmoe2 bailingmoe3 dots1 dots3note arcee afmoe
laguna ernie4_5 ernie4_5-moe hunyuan-moe hunyuan-dense hunyuan_vl hy_v3 hy_v4 smollm3
gpt-oss lfm2 lfm2moe dream smallthinker llada llada-moe seed_oss grovemoe apertus
minimax-m2 cogvlm rnd1 pangu-embedded mistral3 mistral4 paddleocr mimo2 step35 spark2_5
maincoder kimi-linear kimi-k3 glm5-next talkie mellum minimax-m3 nanbeige qwen3tts
pockettts minimax-01 hrm_text
""".split()


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


# "|arch|device|Dense|  OK (0.00e+00)|  OK|": a configuration whose comparison and
# roundtrip both passed (a roundtrip the arch does not support says SKIP)
ROW_OK = re.compile(r"^\|[^|]+\|[^|]+\|\s*(?:Dense|MoE)\|\s*OK \([^)]*\)\|\s*(?:OK|SKIP)\|$", re.M)
SUMMARY = re.compile(r"^Summary: (?:all (\d+) test\(s\) passed|(\d+) test\(s\) executed, (\d+) failed)", re.M)


def parse(text: str) -> tuple[int, int]:
    """(passed, total) from test-llama-archs' output; total -1 without a summary line."""
    text = plain(text)
    m = SUMMARY.search(text)
    if m is None:
        return len(ROW_OK.findall(text)), -1
    if m[1]:
        return int(m[1]), int(m[1])
    total = int(m[2])
    return total - int(m[3]), total


def run_arch(ref_bin: Path, shim: Path, server_argv: list[str], arch: str, timeout: float = 600) -> Result:
    """Run test-llama-archs -b RPC0 -a arch against a fresh server (Result.op: the arch)."""
    argv = [str(ref_bin / "test-llama-archs"), "-b", "RPC0", "-a", arch]
    text, seconds, err = run_client(shim, server_argv, argv, timeout)
    return Result(arch, *parse(text), seconds, plain(text), err)


def save_models(ref_bin: Path, arch: str, out: Path, seed: int = 1, stdev: float = 0.5) -> dict[str, Path]:
    """The models test-llama-archs writes for `arch` (-o: its dense and MoE variants,
    random weights of deviation `stdev`, llama.cpp's `test` vocabulary), by variant."""
    import subprocess

    out.mkdir(parents=True, exist_ok=True)
    argv = [str(ref_bin / "test-llama-archs"), "-a", f"^{re.escape(arch)}$", "-s", str(seed), "-d", str(stdev),
            "-o", str(out)]
    r = subprocess.run(argv, capture_output=True, text=True, errors="replace", timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    found = {v: out / f"{arch}-{v}.gguf" for v in ("dense", "moe")}
    return {v: p for v, p in found.items() if p.exists()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("archs", nargs="*", default=ARCHS, help="architectures to run (default: all)")
    add_side_args(ap)
    args = ap.parse_args(argv)
    return print_table("test-llama-archs", "arch", args.archs, args,
                       lambda ref_bin, shim, server, arch: run_arch(ref_bin, shim, server, arch, args.timeout))


if __name__ == "__main__":
    sys.exit(main())
