"""Imported first in the fork server that workers are forked from (`pool.DEFAULT_PRELOAD`).

tvm_ffi imports PyTorch whenever it can, for DLPack interop with torch tensors. Workers never use
torch (reference functions run in the caller), and the import costs seconds per pool start (three
quarters of the fork server's start-up) and hundreds of MB per process. A `None` entry in
`sys.modules` makes `import torch` fail fast there, and tvm_ffi then goes on without it.
"""
import sys

sys.modules.setdefault("torch", None)
