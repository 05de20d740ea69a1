"""The exception hierarchy of tritonshm.

Everything the library raises derives from :class:`Error`.  Each concrete
class also derives from the built-in exception a caller would naturally
catch (``ValueError`` for bad arguments, ``OSError`` for system failures,
...), so ``except ValueError`` keeps working in code that does not know us.
"""

from __future__ import annotations

import errno as _errno
import os as _os

__all__ = [
    "Error",
    "RegionClosed",
    "OutOfBounds",
    "DTypeMismatch",
    "ShapeMismatch",
    "ReadOnlyRegion",
    "UnsupportedBuffer",
    "InvalidKey",
    "SharedMemoryOSError",
    "CudaUnavailable",
    "CudaError",
    "DLPackError",
    "NotShareable",
    "ServerError",
    "ServerUnavailable",
    "ServerTimeout",
    "ServerInstallError",
    "RegistrationError",
    "RegionNotRegistered",
    "SharedMemoryRefused",
    "OutputTooSmall",
    "PoolExhausted",
    "ClientClosed",
    "InvalidOption",
    "InvalidOptionType",
    "MalformedBytes",
]


class Error(Exception):
    """Base class of every exception tritonshm raises."""


class RegionClosed(Error, ValueError):
    """An operation was attempted on a region after ``close()``."""


class OutOfBounds(Error, ValueError):
    """An offset or size (or their sum) does not fit in the region."""


class DTypeMismatch(Error, TypeError):
    """A dtype is unsupported, or does not match what the model expects."""


class ShapeMismatch(Error, ValueError):
    """A shape is invalid, or does not match what the model expects."""


class ReadOnlyRegion(Error, BufferError):
    """A write, or a writable export, was requested of a read-only mapping."""


class UnsupportedBuffer(Error, TypeError):
    """An object does not export the (C-contiguous) buffer an operation needs."""


class InvalidKey(Error, ValueError, TypeError):
    """Not a usable segment key: not a str, or not '/' then 1-254 characters without '/' or NUL."""


class SharedMemoryOSError(Error, OSError):
    """The operating system refused a shared-memory operation (carries errno)."""


class CudaUnavailable(Error, RuntimeError):
    """CUDA (cuda-python, a driver or a GPU) is not available here."""


class CudaError(Error, RuntimeError):
    """The CUDA runtime refused an operation.

    ``code`` is the ``cudaError_t`` value and ``name`` its name
    (e.g. ``"cudaErrorMemoryAllocation"``).
    """

    def __init__(self, message: str, code: int = 0, name: str = ""):
        super().__init__(message)
        self.code = code
        self.name = name


class NotShareable(UnsupportedBuffer):
    """Device memory that CUDA IPC cannot hand to another process: pool memory
    (``cudaMallocAsync``, torch's ``backend:cudaMallocAsync``), virtual-memory
    mappings (torch's ``expandable_segments``), managed memory.  The client
    copies such tensors through its own CUDA slots instead."""


class DLPackError(Error, BufferError):
    """A DLPack exchange cannot be done as asked (device, stream, copy or layout)."""


class ServerError(Error):
    """The Triton server refused a request; the message says what to do."""


class ServerUnavailable(ServerError, ConnectionError):
    """The Triton server could not be reached or is not ready."""


class ServerTimeout(ServerError, TimeoutError):
    """The server did not answer within the request's ``client_timeout``."""


class ServerInstallError(ServerUnavailable):
    """No local Triton server can be installed here, or the existing install named cannot be used.

    Raised for what the machine lacks or what its settings get wrong -- no
    package index, no ``venv`` module, no backend stub for the server's
    Python, a ``$TRITONSHM_TRITONSERVER`` that does not exist, a server
    Python with numpy 2 -- and when the server's executable cannot be run
    at all. Not raised when a server that did run fails (a model that does
    not load, a startup timeout): those are plain
    :class:`~tritonshm.errors.ServerUnavailable`. The first line of the
    message says what is missing; the lines after it, if any, are details
    (the end of pip's output).
    """


class RegistrationError(ServerError, ValueError):
    """Registering or binding a shared-memory region failed."""


class RegionNotRegistered(RegistrationError):
    """The server does not know a region we reference (unregistered, or restarted)."""


class SharedMemoryRefused(RegistrationError):
    """The server cannot open our memory (not co-located, or client shm disabled)."""


class OutputTooSmall(RegistrationError):
    """The room bound for an output is smaller than the result.

    ``output`` names the output and ``needed`` is the size the server asked
    for, in bytes (None when the server did not say).
    """

    def __init__(self, message: str, output: str | None = None, needed: int | None = None):
        super().__init__(message)
        self.output = output
        self.needed = needed


class PoolExhausted(Error, TimeoutError):
    """No slot could be had: in-flight requests kept every slot busy for the
    whole timeout, or growing the pool would pass ``max_pool_bytes``; the
    message says which."""


class ClientClosed(Error, ValueError):
    """A closed :class:`~tritonshm.Client` (or a closed request of one) was used."""


class InvalidOption(Error, ValueError):
    """A client option or call argument has no valid meaning (a bad URL,
    transport, slot count, or a combination that cannot be honoured)."""


class InvalidOptionType(InvalidOption, TypeError):
    """A client option or call argument is of the wrong type, or is not an option at all
    (an unknown name); an :class:`InvalidOption` that is also a ``TypeError``."""


class MalformedBytes(Error, ValueError):
    """A serialized BYTES tensor is truncated or its lengths run past its end."""


def os_error(err: int, what: str, key: str | None = None) -> SharedMemoryOSError:
    """Build a :class:`SharedMemoryOSError` for ``errno`` *err* while doing *what*.

    The message carries the strerror text and a hint for the usual causes.
    """
    hint = ""
    if err == _errno.ENOSPC or err == _errno.ENOMEM:
        hint = " (is /dev/shm large enough? Docker's default is 64 MB: use --shm-size)"
    elif err == _errno.EACCES:
        hint = " (segments are created mode 0600: only their owner's user may attach)"
    elif err == _errno.ENOENT:
        hint = " (no such segment: it was closed by its owner, or lives in another IPC namespace)"
    exc = SharedMemoryOSError(err, f"{what}: {_os.strerror(err)}{hint}")
    if key is not None:
        exc.filename = key
    return exc
