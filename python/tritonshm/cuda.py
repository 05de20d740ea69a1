"""The CUDA layer (layer 3): CUDA IPC regions, pinned regions, device views.

    from tritonshm import cuda
    cuda.available()                              # never raises
    with tritonshm.CudaRegion.create(1 << 20) as c:
        c.write(torch_tensor)                     # device-to-device, stream-ordered
        t = torch.from_dlpack(c.view("float32", (256, 1024)))   # zero-copy
        slot = c.window(4096, 4096)               # a counted byte range: slot.holders
        cuda.copy(slot, host_array, src_offset=0) # any of regions/windows/views/device/host
        cuda.describe(torch_tensor)               # (dtype, shape, device) or None
        cap = cuda.capture(torch_tensor)          # on the caller's thread: memory + event
        cuda.copy(slot, cap, stream=cuda.copy_stream(0))   # later, any thread; async
        slot.readers_pending()                    # a consumer's stream still reading?

Ordering
--------
Nothing here uses the legacy default stream (``cudaMemcpy``), which
serializes every thread and library of the process, or a device-wide
synchronization.  Copies run on a non-blocking stream: this thread's
:func:`copy_stream` (complete on return), or the :class:`Stream` given
as ``copy(..., stream=)`` (asynchronous).  Producers' pending work is
ordered before a copy by events: a DLPack producer is told the copy's
stream (``__dlpack__(stream=...)``: torch records an event on its current
stream and makes ours wait), a CUDA Array Interface producer's ``stream``
gets an event our stream waits for, and a :class:`Capture` carries an
event recorded when it was taken.  :func:`current_stream` is the caller's
current stream as torch/cupy (or :data:`current_stream_providers`) see it.

Devices: every runtime call and every ``__dlpack__`` of a foreign tensor
runs under :func:`device_guard` of its device, which puts the caller's
previous device back only if it has a context -- no context (hundreds of
MiB) is ever created on a GPU the process did not use.  Device numbers
are checked against the device count (:class:`~tritonshm.OutOfBounds`).

Importing this module loads no CUDA library: the names below come from
Cython modules (:mod:`tritonshm._memory`) that only link the C core, the
runtime is opened on the first operation that needs it, and a machine
without CUDA gets :class:`~tritonshm.CudaUnavailable` with one line saying
what is missing.

How the runtime is reached, and why
-----------------------------------
The C core ``dlopen``\\ s ``libcudart`` and resolves the thirty entry points
it uses (``csrc/tshm_cuda.h``), declared with plain C types.  The
alternatives were weighed against what this layer must guarantee:

* ``cimport cuda.bindings.cyruntime`` builds only as C++ against CUDA
  headers of the bindings' exact version: a wheel could not be built on a
  machine without the toolkit (cuda-python #245), and wheels would be tied
  to one CUDA major.
* ``cuda.bindings.runtime`` from Python cannot run the *last release* of
  device memory: DLPack deleters run on any thread without the GIL, so the
  ``cudaFree`` behind them must be plain C.  It would also put a Python
  call (~1 us) on every copy.
* ``dlopen`` needs no headers at build time, keeps the release in C, and
  works with whichever runtime the process can use.  Its risks are ABI
  details, which are avoided: no struct whose layout changed between CUDA
  12 and 13 is read except ``cudaDeviceProp.name`` at offset 0, and
  ``cudaGetDeviceProperties_v2`` is preferred where 12.x exports it.

The library is found by NVIDIA's own locator, ``cuda-pathfinder`` (the
``[cuda]`` extra installs it with the ``nvidia-cuda-runtime`` wheel), then
by the dynamic loader's search for ``libcudart.so.13``, ``.12`` and the
unversioned name.  A runtime newer than the driver (``cudaErrorInsufficient
Driver``) is skipped for the next.  ``$TRITONSHM_CUDART`` names a library
explicitly (the test suite points it at a fake runtime this way).
"""

from __future__ import annotations

import os
from typing import Any

from ._memory._capture import Capture, capture, describe
from ._memory._copy import copy
from ._memory._cuda_array import CudaArray, empty
from ._memory._cuda_region import CudaRegion
from ._memory._cuda_window import CudaWindow
from ._memory._pinned import PinnedRegion
from ._memory._stream import (  # current_stream_providers: the module's own list, so appending to it works
    Event,
    Stream,
    copy_stream,
    current_stream,
    current_stream_providers,
    device_guard,
)
from .errors import CudaUnavailable

__all__ = [
    "available",
    "device_count",
    "runtime_info",
    "CudaRegion",
    "CudaWindow",
    "CudaArray",
    "copy",
    "describe",
    "empty",
    "capture",
    "Capture",
    "PinnedRegion",
    "Stream",
    "Event",
    "copy_stream",
    "current_stream",
    "current_stream_providers",
    "device_guard",
    "CudaUnavailable",
]

def _runtime() -> Any:
    from ._memory import _runtime

    return _runtime.current()


def available() -> bool:
    """True when a CUDA runtime, a driver and at least one GPU are usable. Never raises."""
    try:
        return _runtime().device_count() > 0
    except Exception:
        return False


def device_count() -> int:
    """The number of visible CUDA devices; 0 when CUDA is unavailable. Never raises."""
    try:
        return int(_runtime().device_count())
    except Exception:
        return 0


def _version(v: int) -> str | None:
    return f"{v // 1000}.{v % 1000 // 10}" if v > 0 else None


def runtime_info() -> dict[str, Any]:
    """What CUDA looks like from here, as a dict. Never raises.

    Keys: ``available``, ``library`` (the file loaded), ``runtime_version``
    and ``driver_version`` (``"12.6"``; None when unknown), ``devices``
    (index, name, compute capability, multiprocessors, PCI bus, whether
    host memory can be pinned), and ``error`` (why CUDA is unavailable, or
    None).  Creates no CUDA context.
    """
    info: dict[str, Any] = {
        "available": False, "library": None, "runtime_version": None,
        "driver_version": None, "devices": [], "error": None,
        "visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    try:
        rt = _runtime()
        info["library"] = rt.library
        runtime, driver = rt.versions()
        info["runtime_version"], info["driver_version"] = _version(runtime), _version(driver)
        info["devices"] = [rt.device_info(i) for i in range(rt.device_count())]
        info["available"] = bool(info["devices"])
    except Exception as exc:  # never raise: this is what doctor prints
        info["error"] = str(exc)
    return info
