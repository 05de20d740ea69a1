"""tritonshm: zero-copy shared memory for NVIDIA Triton Inference Server.

Layers, bottom up (each imports only the ones below it):

1. ``csrc/``               -- the C core: segments, mappings, device allocations, DLPack
2. :mod:`tritonshm._memory` -- reference-counted regions, one Cython module per concept
3. :mod:`tritonshm.cuda`    -- CUDA IPC and pinned memory (the runtime loaded on first use)
4. :mod:`tritonshm.triton`  -- registration with tritonclient clients
5. :mod:`tritonshm.client`  -- the high-level :class:`Client`
6. :mod:`tritonshm.server`, :mod:`tritonshm.cli` -- a local Triton, the command

``import tritonshm`` never needs CUDA, a driver or a GPU, and loads no CUDA
library: :class:`CudaRegion`, :class:`CudaArray` and :class:`PinnedRegion`
come from :mod:`tritonshm.cuda`, whose runtime is opened on first use.
"""

from ._memory import SystemRegion, Window
from . import errors
from .errors import *  # noqa: F401,F403  (the whole hierarchy, listed in errors.__all__)
from .cuda import CudaArray, CudaRegion, PinnedRegion

from .triton import bind_input, bind_output, register, status, unregister
from .client import Client, RequestOptions

__version__ = "0.1.0"

__all__ = [
    "Client",
    "RequestOptions",
    "register",
    "unregister",
    "status",
    "bind_input",
    "bind_output",
    "SystemRegion",
    "Window",
    "CudaRegion",
    "CudaArray",
    "PinnedRegion",
    *errors.__all__,
]
