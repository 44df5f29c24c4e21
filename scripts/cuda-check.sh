#!/usr/bin/env bash
# The CUDA checks that need a GPU, in one short run: what the driver shows, every
# kernel test on the device (the `device` parameter of tests/cuda, marked cuda),
# real device buffers, and the server's device lines. Needs PyCUDA (`.[cuda]`) and
# the package installed in the Python that runs it (PYTHON, default python3).
# Exit status: pytest's. Kernels compile on first use into PyCUDA's cache.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" - <<'PYEOF'
import pycuda.driver as cuda
cuda.init()
n = cuda.Device.count()
print(f"{n} CUDA device(s)")
for i in range(n):
    d = cuda.Device(i)
    print(f"  {i}: {d.name()} sm_{''.join(map(str, d.compute_capability()))} {d.total_memory() >> 20} MiB")
PYEOF
GGMLRPC_CUDA_PREVIEW=1 "$PY" - <<'PYEOF'
from ggmlrpc.cli.server import device_line
from ggmlrpc.devices import select_devices
for d in select_devices(None):
    print(device_line(d))
PYEOF
exec "$PY" -m pytest tests/cuda -m cuda -q -x -ra --timeout 540 "$@"
