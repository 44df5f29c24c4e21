"""`ggml-rpc-cli serve`: llama-server's HTTP API over a model spread on RPC servers."""
from .app import create_app
from .engine import ApiError, Engine

__all__ = ["ApiError", "Engine", "create_app"]
