#!/usr/bin/env bash
# Build the reference llama.cpp peer (ggml-rpc-server, llama-completion, llama-bench,
# llama-simple, llama-quantize, llama-tokenize, test-backend-ops, llama-server,
# test-llama-archs) from the PyPI sdist llama-cpp-python==0.3.36 into a cache directory
# outside the repository. Idempotent: a finished build is reused.
#
#   scripts/build-reference.sh            # builds (once) and prints the bin directory
#   scripts/build-reference.sh --where    # prints the bin directory if the build is
#                                         # complete, else exits 1 (never builds)
#
# ggml is built for this host's CPU (GGML_NATIVE) and as shared libraries (test-backend-ops
# is driven through a small LD_PRELOAD library that registers RPC servers), so the cache
# directory is keyed by the CPU's feature flags: a cache made on another CPU kind is never
# run here. GGMLRPC_REFERENCE_DIR overrides the cache location
# (default: ${XDG_CACHE_HOME:-$HOME/.cache}/ggmlrpc/reference-0.3.36-<cpu key>).
#
# GGMLRPC_REFERENCE_CPU=avx2 builds instead the ggml an AVX2 machine without AVX-512
# (Zen 3, say) runs: AVX2, FMA, F16C, BMI2 and no AVX-512 whatever this CPU has, keyed
# "avx2", with only the programs the byte tests and session recordings need
# (ggml-rpc-server, llama-completion, llama-quantize, test-backend-ops). Point the tests
# at it with GGMLRPC_REFERENCE_BIN and run our executor with GGMLRPC_KERNELS=x86-avx2.
set -euo pipefail

version=0.3.36
cpu=${GGMLRPC_REFERENCE_CPU:-native}
case $cpu in
native)
    cpukey=$( (grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || uname -m) | md5sum | cut -c1-8)
    targets=(ggml-rpc-server llama-completion llama-bench llama-simple llama-quantize
             llama-tokenize test-backend-ops llama-server test-llama-archs)
    arch=(-DGGML_NATIVE=ON) ;;
avx2)
    cpukey=avx2
    targets=(ggml-rpc-server llama-completion llama-quantize test-backend-ops)
    arch=(-DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
          -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=OFF -DGGML_AVX512=OFF
          -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF
          -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF) ;;
*)
    echo "GGMLRPC_REFERENCE_CPU: native or avx2, not '$cpu'" >&2
    exit 2 ;;
esac
cache=${XDG_CACHE_HOME:-$HOME/.cache}/ggmlrpc
root=${GGMLRPC_REFERENCE_DIR:-$cache/reference-$version-$cpukey}
bin=$root/build/bin

have_all() {
    for t in "${targets[@]}"; do [ -x "$bin/$t" ] || return 1; done
    [ -f "$root/.complete" ]
}

if have_all; then
    echo "$bin"
    exit 0
fi
[ "${1:-}" = "--where" ] && exit 1

mkdir -p "$root"
exec 9>"$root/.lock"
flock 9
if have_all; then echo "$bin"; exit 0; fi

if [ ! -d "$root/src/vendor/llama.cpp" ]; then
    # another build of this version (for another CPU) has the sources unpacked
    for other in "$cache"/reference-$version-*/src; do
        if [ -f "$other/vendor/llama.cpp/CMakeLists.txt" ] && [ ! -e "$root/src" ]; then
            cp -a "$other" "$root/src"
        fi
    done
fi
if [ ! -d "$root/src/vendor/llama.cpp" ]; then
    tmp=$(mktemp -d)
    python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
        "llama-cpp-python==$version" -d "$tmp" >&2
    rm -rf "$root/src"
    mkdir -p "$root/src"
    tar -xzf "$tmp"/llama_cpp_python-$version.tar.gz -C "$root/src" --strip-components=1
    rm -rf "$tmp"
fi

jobs=${GGMLRPC_BUILD_JOBS:-$(nproc)}
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)
cmake -S "$root/src/vendor/llama.cpp" -B "$root/build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_RPC=ON \
    "${arch[@]}" \
    -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=ON \
    -DLLAMA_BUILD_SERVER=ON >&2
cmake --build "$root/build" -j "$jobs" --target "${targets[@]}" >&2
touch "$root/.complete"
have_all
echo "$bin"
