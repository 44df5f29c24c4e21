# cython: language_level=3
"""The command table of csrc/common/commands.def as Python reads it (protocol.Cmd,
REQUEST_SIZE and RESPONSE_SIZE are built from it)."""
from ggmlrpc._native.rpc cimport GR_SIZE_NONE, GR_SIZE_VAR, RPC_CMD_COUNT, gr_commands

SIZE_VAR = GR_SIZE_VAR
SIZE_NONE = GR_SIZE_NONE

# (name, id, request bytes, response bytes) per command, in id order
COMMANDS = tuple((gr_commands[i].name.decode(), i, gr_commands[i].request, gr_commands[i].response)
                 for i in range(RPC_CMD_COUNT))
