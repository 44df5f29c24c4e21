"""`ggml-rpc-cli serve`: llama-server's HTTP API (OpenAI's chat and completions,
tokenize, metrics) for a GGUF model over the local CPU and RPC servers. Options
follow llama-server's."""
from __future__ import annotations

import ipaddress
import sys

from .common import CliError
from .run import Progress, add_model_args, load_model
from .server import host_warning, quiet_collector


def _host(value: str) -> str:
    try:
        ipaddress.ip_address(value)
    except ValueError:
        if value != "localhost":
            raise CliError(f"invalid --host {value!r}: expected an IP address") from None
    return value


def cmd_serve(a) -> int:
    import uvicorn

    from ..llm.gguf_file import ModelError
    from ..serve import Engine, create_app
    from ..serve.engine import default_names

    host = _host(a.host)
    if not 0 <= a.port < 65536:
        raise CliError(f"invalid --port {a.port}")
    if a.parallel < 1 and a.parallel != -1:
        raise CliError(f"invalid -np {a.parallel}")
    if a.max_queue < 0:
        raise CliError(f"invalid --max-queue {a.max_queue}")
    if a.request_timeout < 0:
        raise CliError(f"invalid --request-timeout {a.request_timeout:g}")
    if a.batch < 1:
        raise CliError(f"invalid -b {a.batch}")
    if a.prefill_chunk is not None and a.prefill_chunk < 0:
        raise CliError(f"invalid --prefill-chunk {a.prefill_chunk}")
    keys = list(a.api_key or [])
    if a.api_key_file:
        try:
            with open(a.api_key_file, encoding="utf-8") as f:
                keys += [ln.strip() for ln in f if ln.strip() and not ln.startswith("#")]
        except OSError as e:
            raise CliError(f"cannot read --api-key-file: {e}") from None
    if host not in ("127.0.0.1", "localhost"):
        sys.stderr.write(host_warning(host, "HTTP server"))
    n_slots = max(1, a.parallel)
    if a.ctx > 0 and n_slots > 1:    # llama.cpp: each slot n_ctx / N, padded to 256
        a.ctx = -(-(a.ctx // n_slots) // 256) * 256 * n_slots
    model = load_model(a, Progress(), warm_up=True)
    try:
        template = Engine.chat_template(model, a.chat_template_file)
    except ModelError as e:
        model.close()
        raise CliError(str(e)) from None
    engine = Engine(model, default_names(a.model, a.alias), template, a.model, n_slots, a.max_queue,
                    a.request_timeout, a.batch, a.prefill_chunk)
    app = create_app(engine, keys)
    quiet_collector()     # the model and tokenizer: no full collection walks them mid-request
    print(f"serving {engine.names[0]} on http://{host}:{a.port} (n_ctx {model.n_ctx}, "
          f"{n_slots} slot{'s' if n_slots > 1 else ''} of {engine.n_ctx} tokens)", file=sys.stderr, flush=True)
    config = uvicorn.Config(app, host=host, port=a.port, log_level="warning", access_log=False,
                            timeout_graceful_shutdown=5)
    try:
        uvicorn.Server(config).run()
    finally:
        engine.close()
        model.close()
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser("serve", help="llama-server's HTTP API (OpenAI chat and completions)",
                       description="Serve a model over HTTP with llama-server's API. -np slots run "
                                   "requests at once (continuous batching: one step decodes a token "
                                   "of each, with a piece of a new prompt); the others wait in order.")
    add_model_args(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="IP address to listen on (default 127.0.0.1; any other prints a warning)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("-np", "--parallel", type=int, default=-1,
                   help="slots: requests run at once, each with n_ctx / N tokens of context (default 1)")
    p.add_argument("-b", "--batch-size", dest="batch", type=int, default=2048,
                   help="prompt tokens one step may take while no slot is generating (default 2048)")
    p.add_argument("--prefill-chunk", type=int, default=None,
                   help="prompt tokens one step (a micro-batch, with several servers) may take while "
                        "slots are generating: a new prompt holds them up for that long at most "
                        "(default 128; 0: a whole micro-batch, -ub)")
    p.add_argument("--max-queue", type=int, default=0,
                   help="requests that may wait for a slot (default 0: no bound); beyond, 503")
    p.add_argument("--request-timeout", type=float, default=0.0,
                   help="seconds a request may take from its arrival, queue included (default 0: no limit)")
    p.add_argument("-a", "--alias", default=None,
                   help="model name(s) for the API, comma-separated (default: the file name)")
    p.add_argument("--api-key", action="append", default=None,
                   help="API key clients must send (Authorization: Bearer KEY); repeatable")
    p.add_argument("--api-key-file", default=None, help="file of API keys, one a line")
    p.add_argument("--chat-template-file", default=None,
                   help="Jinja chat template (default: the model's, else ChatML)")
    p.add_argument("--jinja", action="store_true", help="accepted: templates are always Jinja")
    p.add_argument("--no-warmup", dest="no_warmup", action="store_true",
                   help="skip the warm-up step (BOS and EOS through every server) before serving")
    for flag in ("--metrics", "--no-webui", "-cb", "--cont-batching"):
        p.add_argument(flag, action="store_true", help="accepted (llama-server's); no effect")
    p.set_defaults(func=cmd_serve)
