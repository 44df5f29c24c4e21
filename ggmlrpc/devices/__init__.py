"""Device discovery and selection, with llama.cpp's rules.

Each backend module has ``discover(n_threads) -> list[Device]`` and is skipped,
with a debug-level reason, when its dependencies are missing. By default the
server exposes every accelerator; with none, one CPU device.
"""
from __future__ import annotations

import logging
import re

from ..errors import DeviceError
from .base import Buffer, Device

log = logging.getLogger("ggmlrpc.devices")

# backend modules tried in order; accelerators first
BACKENDS = ("cuda", "cpu")


def all_devices(n_threads: int | None = None) -> list[Device]:
    import importlib

    found: list[Device] = []
    for name in BACKENDS:
        try:
            mod = importlib.import_module(f"{__name__}.{name}")
            found.extend(mod.discover(n_threads))
        except Exception as e:  # a broken backend must not take the others down
            log.debug("backend %s skipped: %s", name, e)
    return found


def split_names(spec: str) -> list[str]:
    """`-d CUDA0,CPU` or `CUDA0/CPU`: names separated by runs of ',' and '/'."""
    return [n for n in re.split(r"[,/]+", spec) if n]


def select_devices(names: list[str] | None, n_threads: int | None = None) -> list[Device]:
    devices = all_devices(n_threads)
    if names:
        by_name = {d.name: d for d in devices}
        chosen = []
        for n in names:
            if n not in by_name:
                raise DeviceError(f"unknown device: {n}", devices)
            chosen.append(by_name[n])
        return chosen
    accel = [d for d in devices if d.name != "CPU"]
    if accel:
        return accel
    return [d for d in devices if d.name == "CPU"][:1]


__all__ = ["Buffer", "Device", "all_devices", "select_devices", "split_names"]
