"""The memory layer (layer 2): reference-counted regions, one concept per module.

Bottom up (each module imports only those above it in this list):

* :mod:`._args`         -- argument checks every region applies the same way
* :mod:`._region`       -- :class:`~._region.Region`, the lifecycle every region type shares
  (closed state, ``with``, the "live or raise RegionClosed" check, the
  ResourceWarning of an owner dropped unclosed)
* :mod:`._system`       -- :class:`SystemRegion` (POSIX shared memory) and :class:`Window`
* :mod:`._runtime`      -- the CUDA runtime, found and ``dlopen``-ed on first use
* :mod:`._stream`       -- CUDA streams and events, this thread's copy streams, the
  caller's current stream, and the device guard
* :mod:`._dlpack`       -- the DLPack export and import the views share
* :mod:`._pinned`       -- :class:`PinnedRegion`, a system region page-locked for CUDA
* :mod:`._cuda_array`   -- :class:`CudaArray`, a zero-copy device view, and ``empty()``
* :mod:`._cuda_window`  -- :class:`CudaWindow`, a byte range of device memory with a
  count of its holders (a pool's slot)
* :mod:`._cai`          -- the CUDA Array Interface read from a producer
* :mod:`._capture`      -- a producer's device array taken in: ``describe()`` (its dtype,
  shape and device), :class:`Capture` and ``capture()`` (its memory and
  pending work, taken on the caller's thread)
* :mod:`._cuda_region`  -- :class:`CudaRegion`, ``cudaMalloc`` memory with an IPC handle
* :mod:`._copy`         -- ``copy()`` between any two of regions, windows, views,
  captures, device arrays and host buffers

Importing this package, or any of these modules, loads no CUDA library: the
runtime is opened only when a CUDA operation first needs it (see
:mod:`tritonshm.cuda`).
"""

from ._system import SystemRegion, Window

__all__ = ["SystemRegion", "Window"]
