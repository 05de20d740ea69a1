"""GPU tensors at the client's edges: recognising device inputs, placing device results.

A caller's input is a *device input* when it speaks the CUDA Array
Interface or DLPack with a CUDA device (torch, cupy, jax, tritonshm's own
views).  The client never converts one to numpy: it describes it once
(:class:`DeviceTensor`: dtype, shape, device, and a byte offset so that a
large batch can be split without slicing the caller's object) and
*captures* it on the caller's thread, at call time
(:func:`tritonshm.cuda.capture`): its memory held, and an event marking the
work the caller had queued on it by then, recorded on the producer's stream
(the caller's current stream, the CUDA Array Interface's stream; the DLPack
handshake orders any other producer before it).  The tensors of one call
share one such event per stream (:func:`one_ordering_point`): one ordering
point, one wait.  Copies then run on any thread, on that thread's copy
stream, after that event; a tensor lent to the server is read or written
where it is once the event has completed.

Results wanted on a GPU are allocated by the library the inputs came from
(a torch tensor for torch inputs, a cupy array for cupy, else a
:class:`~tritonshm.CudaArray`), so callers get back what they gave.

Where results go is :class:`Placement`: the device of the results (None for
numpy on the host) and the library that allocates them.
"""

from __future__ import annotations

import functools
import math
import threading
import weakref
from collections.abc import Mapping  # (isinstance() on it: typing's alias costs three calls more)
from typing import Any, NamedTuple, Sequence

import numpy as np

from .. import _dtypes
from .._memory import _runtime
from .._memory._capture import capture, capture_at, describe
from .._memory._copy import copy
from .._memory._dlpack import DEVICE_MEMORY_TYPES
from .._memory._cuda_array import empty as cuda_empty
from .._memory._stream import Pending, Stream, copy_stream as thread_copy_stream, current_stream, ordering_event
from ..errors import CudaUnavailable, DTypeMismatch, Error, InvalidOption, ShapeMismatch, UnsupportedBuffer

__all__ = ["DeviceTensor", "OutTensor", "Placement", "Span", "capture_call", "capture_out", "as_device_tensor", "capture_inputs",
           "empty", "to_host", "to_device", "concatenate", "copy_bytes", "copy_stream", "current_stream_event", "parse_device",
           "require_cuda", "library_of", "one_ordering_point", "ordering_event", "distinct", "ResultBlocks",
           "Pending", "Stream", "stream_waited", "waited"]


class DeviceTensor:
    """A C-contiguous device array given as input: described and captured, never converted.

    ``source[offset : offset + nbytes]`` (in bytes) is the tensor, *source*
    its :class:`~tritonshm.cuda.Capture` (which copies wait for); slicing
    along the first axis (what batch chunking does) moves ``offset``.
    *origin* is a weak reference to the object the caller gave (None where it
    takes none): whether the caller still has it tells the lent table whether
    a tensor is used again (:mod:`._lent`).
    """

    __slots__ = ("source", "dtype", "shape", "device", "offset", "library", "origin", "nbytes")

    def __init__(self, source: Any, dtype: np.dtype, shape: tuple[int, ...], device: int,
                 offset: int = 0, library: str | None = None, origin: "weakref.ref[Any] | None" = None):
        self.source = source
        self.dtype = dtype
        self.shape = shape
        self.device = device
        self.offset = offset
        self.library = library_of(source) if library is None else library
        self.origin = origin
        self.nbytes: int = math.prod(shape) * dtype.itemsize  # (read several times by every request)

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a 0-d device tensor")
        return self.shape[0]

    def __getitem__(self, key: slice) -> "DeviceTensor":
        # Only what chunking needs: a contiguous run of rows.
        if not isinstance(key, slice) or key.step not in (None, 1) or not self.shape:
            raise TypeError("a DeviceTensor slices only as rows[start:stop]")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(start, stop)
        row = math.prod(self.shape[1:]) * self.dtype.itemsize
        return DeviceTensor(self.source, self.dtype, (stop - start,) + self.shape[1:], self.device,
                            self.offset + start * row, self.library, self.origin)

    def __repr__(self) -> str:
        return f"<DeviceTensor {self.library} {self.dtype} {self.shape} on cuda:{self.device}>"


class Placement(NamedTuple):
    """Where a request's results go: ``device`` None for numpy on the host, else
    a CUDA device whose arrays *library* ("torch", "cupy" or "tritonshm") allocates."""

    device: int | None
    library: str = "tritonshm"


HOST = Placement(None)


def library_of(obj: Any) -> str:
    """"torch", "cupy" or "tritonshm": who allocates results for inputs like *obj*."""
    root = type(obj).__module__.partition(".")[0]
    return root if root in ("torch", "cupy") else "tritonshm"


# -- one ordering point per call -------------------------------------------------------------


class _Capturing(threading.local):
    #: While a call takes its device arrays (:func:`one_ordering_point`): the captures waiting for
    #: their event, by (device, producer stream); None otherwise.
    pending: "dict[tuple[int, int], list[Any]] | None" = None


_capturing = _Capturing()


# -- copies known complete by a later wait ------------------------------------------------------
#
# A copied result is queued on the caller's stream itself, where it is known; an event recorded
# later on that stream (the next call's ordering point) completes only after the copy has.  So
# when that event is waited for, the copy is known complete without asking CUDA: its slot and
# result block come back with no event query.  (Only an optimisation: a Pending not
# marked here is queried where it matters.)  A stream is known by its handle: one the caller
# destroys while our wait is queued on it, and makes again under the same handle before the copy
# lands, would vouch for a copy it never waited for -- a window of microseconds, on a stream
# destroyed in the middle of the caller's own work with it; CUDA 12's cudaStreamGetId would close it.

_marks_lock = threading.Lock()
_stream_waits: dict[tuple[Any, int, int], list[Any]] = {}  # (runtime, device, stream) -> Pendings waited
# event -> the Pendings it completes after.  The key is a reference: ordering_event() never hands
# out an event listed here to be recorded again (elsewhere, after other work) before waited() pops it.
_covers: dict[Any, list[Any]] = {}
_MARKS = 64  # Pendings remembered per stream, streams, and events at most (the oldest forgotten:
# what is forgotten is queried instead -- a caller making a stream per call grows nothing)


def _stream_key(device: int, stream: int) -> tuple[Any, int, int] | None:
    if stream == 2:  # the per-thread default stream: another stream on every thread
        return None
    return (_runtime.current(), device, 1 if stream == 0 else stream)


def stream_waited(device: int, stream: int, pending: Any) -> None:
    """*stream* (a handle of *device*) was made to wait for *pending*'s event (after the call did it)."""
    key = _stream_key(device, stream)
    if key is None:
        return
    with _marks_lock:
        waits = _stream_waits.get(key)
        if waits is None:
            if len(_stream_waits) >= _MARKS:
                del _stream_waits[next(iter(_stream_waits))]
            waits = _stream_waits[key] = []
        waits.append(pending)
        if len(waits) > _MARKS:
            del waits[0]


def _recording(device: int, stream: int) -> list[Any] | None:
    """The Pendings *stream* waited for so far, taken BEFORE an event is recorded on it: that
    event is then after every one of them."""
    key = _stream_key(device, stream)
    if key is None or not _stream_waits:
        return None
    with _marks_lock:
        return _stream_waits.pop(key, None)


def _recorded(event: Any, pendings: list[Any] | None) -> None:
    if pendings:
        with _marks_lock:
            if len(_covers) >= _MARKS:  # (events recorded and never waited for: a request that failed)
                del _covers[next(iter(_covers))]
            _covers[event] = pendings


def waited(event: Any) -> None:
    """*event* was waited for (complete): the copies it was recorded after are known complete."""
    if not _covers:
        return
    with _marks_lock:
        pendings = _covers.pop(event, None)
    for pending in pendings or ():
        pending.completed()


class one_ordering_point:  # noqa: N801 (a context manager used as a function: ``with one_ordering_point():``)
    """Device arrays captured in the block (on this thread: one call's inputs and ``out=``
    tensors) share one event per producer stream, recorded when the block ends -- one ordering
    point, and one wait, for all of them, where each capture would record its own.  Re-entrant
    (the outermost block records).  Nothing in the block may wait for those captures.

    (A class, not a generator context manager: every GPU request enters it up to three times.)"""

    __slots__ = ("_pending",)

    def __enter__(self) -> None:
        if _capturing.pending is not None:  # inside another: that one records
            self._pending = None
            return
        self._pending = _capturing.pending = {}

    def __exit__(self, *exc_info: Any) -> None:
        pending = self._pending
        if pending is None:
            return
        self._pending = _capturing.pending = None
        for (device, stream), captures in pending.items():
            event = ordering_event(device)
            after = _recording(device, stream) if _stream_waits else None  # (none: the usual case)
            event.record(stream)
            if after:
                _recorded(event, after)
            for captured in captures:
                captured.ordered_by(event)


def _gpu_memory_at(value: Any) -> tuple[int, int] | None:
    """*value*'s ``__dlpack_device__()`` as ints where it says device memory, else None (pinned host
    memory is not).  Read once per tensor: torch's is Python, a few microseconds a call."""
    try:
        kind, device = value.__dlpack_device__()
        where = (int(kind), int(device))
    except Exception:  # (not a DLPack device after all: describe() says what it is)
        return None
    return where if where[0] in DEVICE_MEMORY_TYPES else None


def distinct(events: Sequence[Any]) -> list[Any]:
    """*events* without repeats (captures of one call share theirs), in order."""
    return list(dict.fromkeys(events))


#: Types whose ``__dlpack__`` and ``__dlpack_device__`` are the type's own -> the library that
#: allocates results like them (:func:`library_of`): a warm call's tensors are recognised by one
#: look-up, not a chain of isinstance() and hasattr() (a few types at most; bounded all the same).
_dlpack_types: dict[type, str] = {}
_NOT_DEVICE = (np.ndarray, list, tuple, int, float, bytes, str)


def as_device_tensor(value: Any) -> DeviceTensor | None:
    """*value* described as a :class:`DeviceTensor`, or None when it is not on a GPU.

    Only objects that speak the CUDA Array Interface or DLPack are looked
    at, so plain numpy and lists never reach the CUDA runtime.
    """
    kind = type(value)
    library = _dlpack_types.get(kind)
    if library is None:
        if isinstance(value, _NOT_DEVICE):
            return None
        # (looked up on the type first: the CAI is often a property that builds a dict)
        if not (hasattr(kind, "__dlpack_device__") or hasattr(kind, "__cuda_array_interface__")
                or hasattr(value, "__cuda_array_interface__")):
            return None
        library = library_of(value)
        if hasattr(kind, "__dlpack__") and hasattr(kind, "__dlpack_device__") and len(_dlpack_types) < 64:
            _dlpack_types[kind] = library
        where = _gpu_memory_at(value) if hasattr(kind, "__dlpack__") else None
    else:
        where = _gpu_memory_at(value)
    pending = _capturing.pending  # inside one_ordering_point(): the capture joins the call's others
    if where is not None:
        # A DLPack tensor in device memory (torch, cupy, jax): taken at once, its dtype, shape and
        # device read from the import -- one exchange under one device guard, not two.
        captured = capture_at(value, where, pending=pending)  # a producer's refusal is UnsupportedBuffer there
        if captured.dtype is None:
            captured.release()
            raise DTypeMismatch(f"{type(value).__name__} has a dtype numpy lacks: it cannot be sent")
        dtype, shape, device = captured.dtype, captured.shape, captured.device
    else:
        try:
            described = describe(value)
        except Error:
            raise
        except Exception as exc:  # the producer refused to export (torch: a tensor that requires grad)
            raise UnsupportedBuffer(f"{type(value).__name__} cannot be shared as a device array: {exc}") from exc
        if described is None:
            return None
        dtype, shape, device = described
        captured = capture(value, device, pending=pending)  # a producer's refusal is UnsupportedBuffer there
        dtype, shape = np.dtype(dtype), tuple(shape)
    try:
        origin = weakref.ref(value)
    except TypeError:  # an object that takes no weak references: never known to be dropped
        origin = None
    return DeviceTensor(captured, dtype, shape, device, library=library, origin=origin)


def capture_inputs(inputs: Any) -> Any:
    """*inputs* with every device input captured now, on this thread (a new dict; anything that
    is not a mapping is returned as it is, for the intake to refuse).

    What a call on another thread (``infer_async``, a chunk worker) or later
    (a coroutine) sends is then ordered after the work the caller had queued
    when it called, on its own current stream, not the worker's.
    """
    with one_ordering_point():
        return _captured_inputs(inputs)


def _captured_inputs(inputs: Any) -> Any:
    # (capture_inputs(), inside an ordering point of the caller's)
    if type(inputs) is not dict and not isinstance(inputs, Mapping):
        return inputs
    out = {}
    for name, value in inputs.items():
        tensor = None if isinstance(value, (np.ndarray, DeviceTensor)) else as_device_tensor(value)
        out[name] = value if tensor is None else tensor
    return out


def capture_call(inputs: Any, out: Any) -> tuple[Any, dict[str, OutTensor] | None]:
    """A call's *inputs* and ``out=`` tensors captured now, on this thread, as :func:`capture_inputs`
    and :func:`capture_out` take them -- under one ordering point: one event per producer stream,
    one wait for the request."""
    with one_ordering_point():
        return _captured_inputs(inputs), _captured_out(out)


class Span(NamedTuple):
    """Bytes ``[start, end)`` of the caller's memory on *device* that a request names; *writes*:
    the server writes them (an ``out=`` result), else it reads them."""

    device: int
    start: int
    end: int
    writes: bool

    @classmethod
    def of(cls, tensor: DeviceTensor, writes: bool) -> "Span":
        """Where *tensor* is."""
        start = tensor.source.ptr + tensor.offset
        return cls(tensor.device, start, start + tensor.nbytes, writes)

    def clashes(self, other: "Span") -> bool:
        """Whether the two overlap and one of them is written (two readers never clash)."""
        return (self.writes or other.writes) and self.device == other.device \
            and self.start < other.end and other.start < self.end


class OutTensor(NamedTuple):
    """A result the caller allocated (``out=``): the object handed back, and it captured
    (its memory held, and an event after the work the caller had queued on it: the
    server writes only once that is done)."""

    obj: Any
    tensor: DeviceTensor


def capture_out(out: Any) -> dict[str, OutTensor] | None:
    """``out=`` (output name -> GPU tensor) captured now, on this thread; None stays None.
    Host arrays are refused: results on the host are new numpy arrays."""
    with one_ordering_point():
        return _captured_out(out)


def _captured_out(out: Any) -> dict[str, OutTensor] | None:
    # (capture_out(), inside an ordering point of the caller's)
    if out is None:
        return None
    if type(out) is not dict and not isinstance(out, Mapping):
        raise InvalidOption(f"out must be a mapping of output name to GPU tensor, not {type(out).__name__}")
    captured = {}
    for name, value in out.items():
        if isinstance(value, OutTensor):
            captured[name] = value
            continue
        tensor = as_device_tensor(value)
        if tensor is None:
            raise InvalidOption(f"out[{name!r}] must be a GPU tensor (torch, cupy, CudaArray, ...) for the "
                                f"server to write into, not {type(value).__name__}")
        captured[name] = OutTensor(value, tensor)
    return captured


def require_cuda(what: str) -> int:
    """The number of visible GPUs; :class:`CudaUnavailable`, saying why, when there is none."""
    from .. import cuda

    count = cuda.device_count()
    if count == 0:
        why = cuda.runtime_info()["error"] or "no GPU is visible"
        raise CudaUnavailable(f"{what} needs CUDA, which is not usable here: {why}")
    return count


def parse_device(device: Any, what: str) -> int | None:
    """"cpu" -> None; "cuda" -> 0; "cuda:N" or N -> N, a GPU that exists; anything else is refused
    (before anything is sent: a result with nowhere to go would be lost)."""
    if device == "cpu":
        return None
    if device == "cuda":
        number = 0
    elif isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        number = int(device[5:])
    elif isinstance(device, int) and not isinstance(device, bool) and device >= 0:
        number = device
    else:
        raise InvalidOption(f"{what} must be 'cpu', 'cuda', 'cuda:N' or a device number, not {device!r}")
    count = require_cuda(f"{what}={device!r}")
    if number >= count:
        raise InvalidOption(f"{what}={device!r}, but {count} GPU(s) are visible here (cuda:0 to cuda:{count - 1})")
    return number


@functools.lru_cache(maxsize=None)
def _torch_dtype(dtype: np.dtype) -> Any:
    import torch

    if dtype == _dtypes.BFLOAT16:  # ml_dtypes' bfloat16, which torch's numpy mapping does not know
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, dtype)).dtype  # torch's own numpy mapping


@functools.lru_cache(maxsize=None)
def _torch_device(device: int) -> Any:
    import torch

    return torch.device("cuda", device)  # made once: torch parses device strings on every call


_BLOCK_ROUND = 512            # result blocks up to 1 MiB: multiples of this
_BLOCK_SMALL = 1 << 20
_BLOCK_LARGE_ROUND = 2 << 20  # larger ones: multiples of 2 MiB (torch's caching allocator's classes)
_BLOCKS_PER_CLASS = 8         # cached blocks of one size and device at most
_BLOCKS_MAX_BYTES = 1 << 30   # cached bytes at most (per client); beyond, results are freed when dropped


def _block_bytes(nbytes: int) -> int:
    if nbytes <= _BLOCK_SMALL:
        return max(_BLOCK_ROUND, -(-nbytes // _BLOCK_ROUND) * _BLOCK_ROUND)
    return -(-nbytes // _BLOCK_LARGE_ROUND) * _BLOCK_LARGE_ROUND


class ResultBlocks:
    """Device memory for a client's :class:`~tritonshm.CudaArray` results, cached as torch's caching
    allocator caches its blocks: a result is a view of a block of its size class, and a block
    whose every view (and every DLPack tensor made from one) is gone -- and whose DLPack readers'
    streams are done with it (:meth:`~tritonshm.cuda.CudaWindow.readers_pending`, as a pool's
    slot) -- holds the next result of that class.  So a warm request allocates and frees no device
    memory (``cudaFree`` synchronizes the device, too).

    A block is a :class:`~tritonshm.cuda.CudaWindow` over a region of its own: the memory is freed
    only when the window and every view of it are gone -- :meth:`clear` (the client's ``forget()``
    and ``close()``) lets go of the cache's windows, and a result still alive keeps its block
    until it dies.  Never more than :data:`_BLOCKS_PER_CLASS` blocks of one class, nor
    :data:`_BLOCKS_MAX_BYTES` bytes, are cached: results beyond are freed when dropped."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._blocks: dict[tuple[int, int], list[Any]] = {}
        self.nbytes = 0  # of the blocks cached
        self.closed = False

    def empty(self, dtype: np.dtype, shape: tuple[int, ...], device: int, pending: Any = None) -> Any:
        """A :class:`~tritonshm.CudaArray` of *shape* x *dtype* on *device*, uninitialised;
        *pending* (a :class:`~tritonshm.cuda.Pending`): the copy about to be queued into it --
        its block is not handed out again before that copy is complete, even if the result is
        dropped first (the next copy into it may run on another thread's stream)."""
        size = _block_bytes(math.prod(shape) * dtype.itemsize)
        key = (device, size)
        with self._lock:
            for entry in self._blocks.get(key, ()):
                block, after = entry
                if block.holders <= 1 and (after is None or after.query()) and not block.readers_pending():
                    entry[1] = pending
                    return block.view(dtype, shape)  # (under the lock: no other thread takes it too)
        from .._memory._cuda_region import CudaRegion

        region = CudaRegion.create(size, device)
        try:
            block = region.window(0, size)
            view = block.view(dtype, shape)
        finally:
            region.close()  # the window and its views hold the memory now: freed when they are all gone
        with self._lock:
            blocks = self._blocks.setdefault(key, [])
            if not self.closed and len(blocks) < _BLOCKS_PER_CLASS and self.nbytes + size <= _BLOCKS_MAX_BYTES:
                blocks.append([block, pending])
                self.nbytes += size
        return view

    def clear(self, close: bool = False) -> None:
        """Let go of every cached block: each is freed now, or once its last result is gone;
        *close*: cache nothing from now on (the client closed)."""
        with self._lock:
            blocks, self._blocks, self.nbytes = self._blocks, {}, 0
            self.closed = self.closed or close
        for entries in blocks.values():  # no block is let go of under a copy into it
            for _, after in entries:
                if after is not None:
                    after.synchronize()
        blocks.clear()  # (the windows die here, outside the lock: a free may run)

    def stats(self) -> tuple[int, int]:
        """(blocks, bytes) cached now."""
        with self._lock:
            return sum(len(blocks) for blocks in self._blocks.values()), self.nbytes


def empty(placement: Placement, dtype: np.dtype, shape: Sequence[int], blocks: ResultBlocks | None = None,
          pending: Any = None) -> Any:
    """A new, uninitialised device array of *shape* x *dtype* where *placement* says (our own
    arrays from *blocks*, where given: a client's cached result blocks, *pending* the copy
    about to be queued into it: see :meth:`ResultBlocks.empty`)."""
    device, shape = placement.device, tuple(shape)
    assert device is not None, "host results are numpy arrays"
    if placement.library == "torch":
        import torch

        try:
            torch_dtype = _torch_dtype(dtype)
        except TypeError:  # a dtype this torch lacks (uint32 before torch 2.3): our own array then
            pass
        else:
            return torch.empty(shape, dtype=torch_dtype, device=_torch_device(device))
    if placement.library == "cupy":
        import cupy

        with cupy.cuda.Device(device):
            return cupy.empty(shape, dtype)
    if blocks is not None:
        return blocks.empty(np.dtype(dtype), shape, device, pending)
    return cuda_empty(dtype, shape, device)


def copy_bytes(dst: Any, src: Any, nbytes: int, dst_offset: int = 0, src_offset: int = 0,
               stream: Any = None, done: Any = None, then: Any = None) -> None:
    """:func:`tritonshm.cuda.copy`: bytes between host and device memory, after a captured
    source's event.  With *stream* (a :class:`~tritonshm.cuda.Stream`) the copy is queued
    there and lands later (record an event on it: ``stream.record()``); without, it is
    complete on return."""
    copy(dst, src, nbytes, dst_offset=dst_offset, src_offset=src_offset, stream=stream, done=done, then=then)


def results_stream(results: Placement, claim: Any = None, out: Mapping[str, OutTensor] | None = None) -> int | None:
    """The caller's stream that copied results on *results*' device are ordered on, or None where
    it is not known (then another library's results are waited for on the CPU): the stream the
    call's device inputs or ``out=`` tensors were captured on (the caller's current stream at call
    time, on the caller's thread), if that is also this thread's current stream -- where
    torch's or cupy's allocator hands out the results' memory (a call run on a worker thread
    allocates on the worker's).  Our own arrays carry their copy with them instead."""
    device = results.device
    if device is None:
        return None
    captured = [tensor.source for tensor, _ in claim.tensors] if claim is not None else []
    captured += [given.tensor.source for given in (out or {}).values()]
    for source in captured:
        if getattr(source, "device", None) == device and getattr(source, "event", None) is not None:
            stream = source.stream or 1  # (0: the legacy default stream, as a handle a wait can name)
            if stream == 2:  # the per-thread default stream: the capturing thread's, not ours
                return None
            if results.library == "tritonshm":
                return stream
            here = current_stream(device)
            return stream if stream == (here or 1) else None
    return None


def copy_stream(device: int | None) -> Any:
    """This thread's copy stream on *device* (non-blocking, made once per thread); None for the host."""
    if device is None:
        return None
    return thread_copy_stream(device)


def current_stream_event(device: int, stream: Any = None) -> Any:
    """An event marking the work queued so far on *stream* (a Stream, a handle, or an object with
    ``cuda_stream`` / ``ptr``: torch's and cupy's streams) or, by default, on the calling thread's
    current stream for *device* (torch's or cupy's notion of it where they are loaded)."""
    handle: Any
    if stream is None:
        handle = current_stream(device)
    elif isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    else:
        handle = getattr(stream, "handle", None)
        if handle is None:
            handle = getattr(stream, "cuda_stream", None)
        if handle is None:
            handle = getattr(stream, "ptr", None)
        if not isinstance(handle, int) or isinstance(handle, bool):
            raise InvalidOption(f"stream must be a CUDA stream handle (int), a tritonshm, torch or cupy "
                                f"stream, not {stream!r}")
    return ordering_event(device).record(handle)


def to_host(tensor: DeviceTensor) -> np.ndarray:
    """A numpy copy of a device input (for the plain gRPC/HTTP path)."""
    out = np.empty(tensor.shape, tensor.dtype)
    copy_bytes(out, tensor.source, tensor.nbytes, src_offset=tensor.offset)
    return out


def to_device(array: np.ndarray, placement: Placement) -> Any:
    """A device copy of a host result, allocated where *placement* says (complete on return)."""
    out = empty(placement, array.dtype, array.shape)
    copy_bytes(out, np.ascontiguousarray(array), array.nbytes)
    return out


def concatenate(parts: Sequence[Any], placement: Placement) -> Any:
    """Device arrays (same dtype, rows of the same shape) joined along the first axis."""
    if library_of(parts[0]) == "torch":  # torch joins its own tensors
        import torch

        return torch.cat(list(parts))
    dtype = np.dtype(parts[0].dtype)
    shapes = [tuple(part.shape) for part in parts]
    if any(shape[1:] != shapes[0][1:] for shape in shapes):
        raise ShapeMismatch(f"the chunks of a batch returned rows of different shapes {shapes}: "
                            f"they cannot be joined")
    out = empty(placement, dtype, (sum(s[0] for s in shapes),) + shapes[0][1:])
    offset = 0
    for part, shape in zip(parts, shapes):
        nbytes = math.prod(shape) * dtype.itemsize
        copy_bytes(out, part, nbytes, dst_offset=offset)
        offset += nbytes
    return out
