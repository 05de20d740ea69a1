"""The memory layer (layer 2): reference-counted regions, one concept per module.

* :mod:`._system`  -- :class:`SystemRegion` (POSIX shared memory) and :class:`Window`
* :mod:`._pinned`  -- :class:`PinnedRegion`, a system region page-locked for CUDA
* :mod:`._cuda`    -- :class:`CudaRegion` (cudaMalloc + IPC handle) and its device views
* :mod:`._dlpack`  -- the DLPack export and import the views share
* :mod:`._runtime` -- the CUDA runtime, found and ``dlopen``-ed on first use
* :mod:`._stream`  -- CUDA streams and events, this thread's copy streams, the
  caller's current stream, and the device guard
* :mod:`._args`    -- argument checks every region applies the same way

Importing this package loads no CUDA library: the runtime is opened only
when a CUDA operation first needs it (see :mod:`tritonshm.cuda`).
"""

from ._system import SystemRegion, Window

__all__ = ["SystemRegion", "Window"]
