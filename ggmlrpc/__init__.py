"""ggmlrpc: ggml's RPC system (llama.cpp's ggml-rpc-server and client) in Python."""
from .errors import (ConnectionLost, DeviceError, GgmlRpcError, ProtocolError, RpcTimeout,
                     ServerClosed, UnsupportedError, ValidationError, VersionMismatch)

__version__ = "0.1.0"


def __getattr__(name):
    # the client pulls in numpy; import it on first use
    if name in ("RemoteBackend", "RemoteBuffer", "RemoteTensor"):
        from . import client
        return getattr(client, name)
    raise AttributeError(name)


__all__ = ["RemoteBackend", "RemoteBuffer", "RemoteTensor", "GgmlRpcError", "ProtocolError",
           "ValidationError", "UnsupportedError", "DeviceError", "ConnectionLost", "ServerClosed",
           "VersionMismatch", "RpcTimeout"]
