"""Allocate GPU memory through the CUDA driver API (``libcuda.so``, via ctypes): no framework needed.

Run as a process: ``python cuda_alloc.py MIB SECONDS`` makes a context on GPU 0, allocates MIB of
device memory, prints ``ready <pid>`` and holds it for SECONDS (or until killed), then exits.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time


def main() -> int:
    mib, seconds = int(sys.argv[1]), float(sys.argv[2])
    cuda = ctypes.CDLL("libcuda.so.1")
    device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
    for name, call in (
        ("cuInit", lambda: cuda.cuInit(0)),
        ("cuDeviceGet", lambda: cuda.cuDeviceGet(ctypes.byref(device), 0)),
        ("cuCtxCreate", lambda: cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)),
        ("cuMemAlloc", lambda: cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib * 1024 * 1024))),
    ):
        status = call()
        if status != 0:
            print(f"{name} failed: CUresult {status}", file=sys.stderr)
            return 1
    print(f"ready {os.getpid()}", flush=True)
    time.sleep(seconds)
    cuda.cuMemFree_v2(pointer)
    cuda.cuCtxDestroy_v2(context)
    return 0


if __name__ == "__main__":
    sys.exit(main())
