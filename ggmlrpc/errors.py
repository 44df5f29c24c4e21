"""Exceptions raised by ggmlrpc. Input checks raise these, never `assert`."""


class GgmlRpcError(Exception):
    """Base class of every ggmlrpc error."""


class ProtocolError(GgmlRpcError):
    """A peer sent bytes that break the wire protocol (bad size, unknown command...)."""


class ValidationError(ProtocolError):
    """A request is well framed but names something invalid (type, range, buffer...)."""


class UnsupportedError(ValidationError):
    """A request is valid ggml but this server cannot execute it (op or type missing)."""


class DeviceError(GgmlRpcError):
    """A device could not be found, opened or used."""


class ConnectionLost(GgmlRpcError, ConnectionError):
    """The peer closed the connection or the socket failed."""


class ServerClosed(ConnectionLost):
    """The server closed the connection after a request (it rejects bad requests so)."""


class VersionMismatch(GgmlRpcError):
    """The server speaks a protocol version this client does not accept."""


class RpcTimeout(ConnectionLost, TimeoutError):
    """No answer arrived within the configured timeout."""
