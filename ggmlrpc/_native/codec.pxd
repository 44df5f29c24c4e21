# The native codec (codec.pyx): rpc_tensor <-> RpcTensor, and what a data command
# keeps of a validated tensor.
from libc.stdint cimport uint64_t

from ggmlrpc._native.rpc cimport rpc_tensor

cdef object tensor_from_c(const rpc_tensor *t)
cdef int tensor_to_c(object o, rpc_tensor *t) except -1

cdef class IoTensor:
    cdef readonly uint64_t buffer
    cdef readonly uint64_t data
    cdef public uint64_t nbytes
    cdef bytes _name
