"""CUDA devices through PyCUDA (optional extra `ggmlrpc[cuda]`).

Discovery only for now: the CUDA buffer and kernels arrive with the CUDA work.
A host without PyCUDA, a driver or a GPU simply has no CUDA devices.
"""
from __future__ import annotations

import logging

log = logging.getLogger("ggmlrpc.devices")


def discover(n_threads: int | None = None):
    try:
        import pycuda.driver  # noqa: F401
    except ImportError as e:
        log.debug("CUDA backend skipped: %s", e)
        return []
    log.debug("CUDA backend skipped: CUDA buffers are not implemented yet")
    return []
