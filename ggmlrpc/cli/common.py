"""What every `ggml-rpc-cli` command shares: its error and the --rpc endpoint list
(below cli.main and the commands, so that none of them imports another's module)."""
from __future__ import annotations


class CliError(Exception):
    """One line for stderr; the command exits with status 1."""


def split_endpoints(value: str) -> list[str]:
    eps = [e.strip() for e in value.split(",") if e.strip()]
    if not eps:
        raise CliError(f"no server named in {value!r}")
    for e in eps:
        host, _, port = e.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CliError(f"invalid endpoint {e!r}: expected host:port")
    return eps
