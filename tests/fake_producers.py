"""Torch-like and cupy-like producer DOUBLES over the FAKE CUDA runtime (tests only, never shipped).

They stand in for torch and cupy where neither (nor a GPU) is installed, and
behave the way those libraries do in the respects that decide whether a
consumer of their memory is correct:

* **Per-thread, per-device current stream.**  Each thread starts on the
  legacy default stream of every device; ``with producer.stream(device):``
  makes a new non-blocking stream current for that thread and device.
* **Everything is asynchronous.**  ``t.copy_(x)`` and ``t.fill_(v)`` are
  test-only "kernel writes" (``tshm_fake_cuda_kernel_write``) queued on the
  current stream of the tensor's device: the bytes reach the (fake) device
  memory only when something synchronizes that stream.  ``t.numpy()`` copies
  on the current stream and synchronizes it, as ``.cpu()`` does.
* **DLPack export with the stream handshake.**  ``t.__dlpack__(stream=s)``
  records an event on the producer's current stream and makes ``s`` wait on
  it when ``s`` is another stream; ``None`` stands for the legacy default
  stream (1), ``-1`` for "no synchronization".  ``TorchLike`` is torch >= 2.5's
  ``Tensor.__dlpack__``: it refuses to export a tensor that is not on the
  thread's current device (``BufferError("Can't export tensors on a different
  CUDA device index...")``), the per-thread default stream 2 (BufferError) and
  0 (AssertionError).  ``CupyLike`` works under a guard of the array's device.
* **CUDA Array Interface v3** (``CupyLike``): ``"stream"`` is the current
  stream of the array's device (1 for the legacy default stream).
  ``TorchLike``'s tensors have torch 2.11's: version 2, no ``"stream"``,
  ``"strides"`` None (compact), the typestr of the dtype -- ``"<V2"`` for
  bfloat16, a void type the interface cannot name (DLPack can: kDLBfloat).
  Consumers that prefer DLPack (``capture()``) still take DLPack.
* **torch's launch check.**  Every ``TorchLike`` "kernel" (``copy_``, and so
  ``fill_``, ``zeros``, ``from_numpy``, ``tensor``) reads the runtime's
  last error after its launch and raises :class:`FakeAcceleratorError`
  ("CUDA error: invalid argument") when one is set, clearing it, as torch's
  ``C10_CUDA_KERNEL_LAUNCH_CHECK`` (``cudaGetLastError()``) does: a failure
  another library left on the thread's last error fails the caller's next
  torch op, as it did on an H200.  (The last error is the fake runtime's,
  the same instance tritonshm loads.)
* **A consumer.**  ``producer.from_dlpack(obj)`` does what ``torch.from_dlpack``
  does: passes its current stream for the object's device (1 for legacy),
  asks for a versioned capsule first, and holds the capsule until the
  resulting tensor dies, when it calls the producer's deleter.
* **Memory** of ``empty``/``zeros``/``from_numpy`` is the fake's own
  ``cudaMalloc`` (through ctypes) on the tensor's device, freed (under a guard
  of that device) when the tensor dies -- or, with ``TorchLike(fake,
  caching=True)``, a block of a :class:`CachingAllocator` segment: torch's
  caching allocator as far as lifetimes go (blocks carved from segments and
  handed out again at once when freed, ``empty_cache()`` freeing the
  segments whose blocks are all free, ``expandable_segments=True`` making
  segments CUDA IPC cannot export).

``producer.current_stream_provider(device)`` answers what tritonshm's
``_stream.current_stream_providers`` expect: the thread's current stream on
*device* when the double has one set there (a non-default stream), else None
("not mine: ask the next provider"; the default is the legacy stream).  The
``torch_like`` / ``cupy_like`` fixtures of cuda_fixtures.py register it.

This module needs neither tritonshm nor torch/cupy: numpy, ctypes and
fake_cuda only.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
import weakref

import ml_dtypes
import numpy as np

import fake_cuda
from fake_cuda import DLManagedTensor, DLManagedTensorVersioned, FakeCudart

KDL_CUDA = 2
DEVICE_INDEX_ERROR = "Can't export tensors on a different CUDA device index"


class FakeAcceleratorError(RuntimeError):
    """torch.AcceleratorError's double (a RuntimeError): a kernel launch found the thread's
    CUDA last error set."""

    def __init__(self, code: int, text: str):
        super().__init__(f"CUDA error: {text}")
        self.code = code


# --------------------------------------------------------------------------
# DLPack capsules made through the C API (ctypes): what torch's C++ does
# --------------------------------------------------------------------------

_NAME_VERSIONED = ctypes.create_string_buffer(b"dltensor_versioned")  # the capsule keeps a pointer to it
_NAME_LEGACY = ctypes.create_string_buffer(b"dltensor")
_PyCapsule_New = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
# The same C API on a raw PyObject * (the capsule destructor gets one that is being freed).
_PyCapsule_IsValid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", ctypes.pythonapi))
_PyCapsule_GetPointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
_PyCapsule_GetName = ctypes.PYFUNCTYPE(ctypes.c_char_p, ctypes.py_object)(("PyCapsule_GetName", ctypes.pythonapi))

#: Exported managed tensors by address: (struct, shape array, the tensor it keeps alive).
_EXPORTS: dict[int, tuple] = {}


def _release_export(address: int, exports: dict[int, tuple] = _EXPORTS) -> None:
    # (*exports* bound now: at exit the module's globals are cleared before the last consumers die)
    exports.pop(address, None)


# The managed tensor's deleter: a consumer calls it from any thread, with or
# without the GIL (a ctypes callback takes the GIL itself).
_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_release_export)


def _capsule_destructor(capsule: int, valid: Any = _PyCapsule_IsValid, pointer: Any = _PyCapsule_GetPointer,
                        names: tuple = (_NAME_VERSIONED, _NAME_LEGACY)) -> None:
    # Never consumed (still "dltensor..."): the producer lets go itself.
    for name in names:
        if valid(capsule, name):
            _release_export(pointer(capsule, name))
            return


_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(_capsule_destructor)

# A torch or cupy deleter is C code that lives as long as the process; these are ctypes objects,
# and the structs they free live in _EXPORTS.  A consumer may let go of an export last of all, at
# exit, after the module's globals were cleared (a capture held by a module-level name): kept for
# the process's life, the deleters and what they free are still there then, as torch's are.
ctypes.pythonapi.Py_IncRef(ctypes.py_object((_EXPORTS, _DELETER, _CAPSULE_DESTRUCTOR, _release_export)))

_DL_CODES = {"i": 0, "u": 1, "f": 2, "b": 6}  # kDLInt, kDLUInt, kDLFloat, kDLBool
_NP_KINDS = {v: k for k, v in _DL_CODES.items()}
KDL_BFLOAT = 4  # torch's bfloat16 (ml_dtypes.bfloat16 in numpy terms)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)


def _dl_dtype(dtype: np.dtype) -> tuple[int, int]:
    if dtype == BFLOAT16:
        return KDL_BFLOAT, 16
    if dtype.kind not in _DL_CODES:
        raise BufferError(f"no DLPack type for {dtype}")
    return _DL_CODES[dtype.kind], dtype.itemsize * 8


def _np_dtype(code: int, bits: int, lanes: int) -> np.dtype:
    if (code, bits, lanes) == (KDL_BFLOAT, 16, 1):
        return BFLOAT16
    if lanes != 1 or code not in _NP_KINDS:
        raise BufferError(f"unsupported DLPack dtype code={code} bits={bits} lanes={lanes}")
    return np.dtype("?") if code == 6 else np.dtype(f"{_NP_KINDS[code]}{bits // 8}")


def _make_capsule(tensor: FakeDeviceTensor, versioned: bool):
    shape = (ctypes.c_int64 * max(len(tensor.shape), 1))(*tensor.shape)
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    if versioned:
        managed.major, managed.minor = 1, 0
        managed.flags = 1 if tensor.read_only else 0  # DLPACK_FLAG_BITMASK_READ_ONLY
    dl = managed.dl_tensor
    dl.data = tensor.ptr
    dl.device_type, dl.device_id = KDL_CUDA, tensor.device
    dl.ndim = len(tensor.shape)
    dl.code, dl.bits = _dl_dtype(tensor.dtype)
    dl.lanes = 1
    dl.shape = ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64))
    dl.strides = None  # compact, row-major
    dl.byte_offset = 0
    managed.deleter = ctypes.cast(_DELETER, ctypes.c_void_p).value
    address = ctypes.addressof(managed)
    # The export keeps the tensor object itself alive, as torch's and cupy's do in effect: cupy's
    # capsule holds the array, and torch keeps a tensor's Python object alive while its storage
    # has another owner (PyObject preservation; seen on an H200: a dropped tensor's weak reference
    # stayed alive while a capture held it).  So nobody can tell that the caller dropped it.
    _EXPORTS[address] = (managed, shape, tensor)
    name = _NAME_VERSIONED if versioned else _NAME_LEGACY
    return _PyCapsule_New(address, ctypes.addressof(name), ctypes.cast(_CAPSULE_DESTRUCTOR, ctypes.c_void_p).value)


def live_exports() -> int:
    """Capsules made by the doubles whose deleter has not run yet."""
    return len(_EXPORTS)


# --------------------------------------------------------------------------
# Tensors
# --------------------------------------------------------------------------


def _free_device_memory(producer_ref, fake: FakeCudart, ptr: int, device: int) -> None:
    producer = producer_ref()
    guard = producer.device(device) if producer is not None else contextlib.nullcontext()
    with guard:
        fake.free(ptr)


class CachingAllocator:
    """torch's CUDA caching allocator, as far as the lifetimes of its memory go.

    * Requests are rounded up to 512 bytes.  Up to 1 MiB they are carved from
      2 MiB segments (torch's small pool); larger ones from segments of their
      own size rounded up to 2 MiB (its large pool), reused for any request
      that fits once free.  So a small tensor usually sits at an offset inside
      an allocation shared with others, as on a real GPU.
    * A freed block goes back to its segment at once (adjacent free blocks
      merge) and is handed out again by the next request that fits -- torch
      does that without waiting for the GPU, for work on the same stream.
    * ``cudaFree`` of a segment happens only in :meth:`empty_cache`, and only
      for segments whose blocks are all free: a live tensor keeps its segment.
    * ``expandable_segments=True``: segments come from memory CUDA IPC cannot
      export (the fake's ``cudaMallocAsync``), as torch's
      ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` (cuMemCreate/cuMemMap) gives.
    """

    SMALL = 1 << 20
    SMALL_SEGMENT = 2 << 20
    ROUND = 512

    def __init__(self, fake: FakeCudart, expandable_segments: bool = False):
        self.fake = fake
        self.expandable_segments = expandable_segments
        self._lock = threading.Lock()
        #: segment base -> [device, size, small, blocks]; blocks: sorted [offset, size, free]
        self._segments: dict[int, list] = {}
        self.segment_frees = 0

    def malloc(self, nbytes: int, device: int) -> int:
        """A block of at least *nbytes* on *device* (the caller has the device current)."""
        need = max(self.ROUND, -(-nbytes // self.ROUND) * self.ROUND)
        small = need <= self.SMALL
        with self._lock:
            for base, (dev, _, seg_small, blocks) in self._segments.items():
                if dev != device or seg_small != small:
                    continue
                for i, (offset, size, free) in enumerate(blocks):
                    if free and size >= need:
                        blocks[i:i + 1] = [[offset, need, False]] + ([[offset + need, size - need, True]]
                                                                     if size > need else [])
                        return base + offset
            size = self.SMALL_SEGMENT if small else -(-need // self.SMALL_SEGMENT) * self.SMALL_SEGMENT
            base = (self.fake.malloc_unshareable(size) if self.expandable_segments else self.fake.malloc(size))
            blocks = [[0, need, False]] + ([[need, size - need, True]] if size > need else [])
            self._segments[base] = [device, size, small, blocks]
            return base

    def free(self, ptr: int) -> None:
        """Give the block at *ptr* back to its segment (the memory stays allocated)."""
        with self._lock:
            for base, (_, size, _, blocks) in self._segments.items():
                if base <= ptr < base + size:
                    for i, block in enumerate(blocks):
                        if base + block[0] == ptr and not block[2]:
                            block[2] = True
                            merged: list = []
                            for b in blocks:  # merge neighbouring free blocks
                                if merged and merged[-1][2] and b[2]:
                                    merged[-1][1] += b[1]
                                else:
                                    merged.append(list(b))
                            blocks[:] = merged
                            return
            raise ValueError(f"0x{ptr:x} is not a live block of this allocator")

    def empty_cache(self) -> int:
        """``torch.cuda.empty_cache()``: cudaFree every segment whose blocks are all free;
        how many were freed."""
        with self._lock:
            idle = [base for base, (_, _, _, blocks) in self._segments.items() if all(b[2] for b in blocks)]
            for base in idle:
                device = self._segments.pop(base)[0]
                previous = self.fake.get_device()
                self.fake.set_device(device)
                try:
                    self.fake.free(base)
                finally:
                    self.fake.set_device(previous)
            self.segment_frees += len(idle)
            return len(idle)

    def segments(self) -> list[tuple[int, int]]:
        """(base, size) of every segment held."""
        with self._lock:
            return [(base, seg[1]) for base, seg in self._segments.items()]


def _free_block(allocator: CachingAllocator, ptr: int) -> None:
    allocator.free(ptr)


class _Storage:
    """The owner of a tensor's memory (torch's ``UntypedStorage``): the memory is freed, or
    its block given back, when the last tensor or export holding it is gone."""


class FakeDeviceTensor:
    """A contiguous array in fake device memory, owned by its producer double.

    ``ptr``, ``nbytes``, ``shape``, ``dtype``, ``device``; ``data_ptr()`` as
    torch.  ``owner`` is whatever keeps the memory alive (a consumed capsule
    for a tensor made by ``from_dlpack``).
    """

    def __init__(self, producer: _Producer, ptr: int, shape, dtype, device: int, *, read_only: bool = False):
        self.producer = producer
        self.ptr = ptr
        self.shape = tuple(int(n) for n in shape)
        self.dtype = np.dtype(dtype)
        self.device = device
        self.read_only = read_only
        self.nbytes = int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize
        #: What owns the memory (freed when it dies), as torch's storage: set by the producer
        #: that allocated it; None for a tensor made by from_dlpack (its capsule owns it).
        self.storage: _Storage | None = None

    def data_ptr(self) -> int:
        return self.ptr

    def __repr__(self) -> str:
        return (f"<{type(self).__name__} {self.dtype}{list(self.shape)} cuda:{self.device} "
                f"at 0x{self.ptr:x}>")

    # --- asynchronous writes on the current stream -------------------------

    def copy_(self, src) -> FakeDeviceTensor:
        """Queue a copy of *src* (array-like, or another fake device tensor) on the current stream."""
        if self.read_only:
            raise ValueError("this tensor is read-only")
        p = self.producer
        with p.device(self.device):
            stream = p.current_stream(self.device)
            if isinstance(src, FakeDeviceTensor):
                if src.nbytes != self.nbytes:
                    raise ValueError(f"copy_ of {src.nbytes} bytes into {self.nbytes}")
                p.fake.memcpy_async(self.ptr, src.ptr, self.nbytes, stream, 3)
            else:
                data = np.ascontiguousarray(np.broadcast_to(np.asarray(src, dtype=self.dtype), self.shape))
                p.fake.kernel_write(stream, self.ptr, data.tobytes())
            self._launch_check()
        return self

    def _launch_check(self) -> None:
        """After a "kernel" launch: nothing for a cupy-like array (cupy launches through the driver)."""

    def fill_(self, value) -> FakeDeviceTensor:
        return self.copy_(np.full(self.shape, value, dtype=self.dtype))

    # --- reads ---------------------------------------------------------------

    def numpy(self) -> np.ndarray:
        """Copy to the host on the current stream and wait for that stream (as ``.cpu()``)."""
        out = np.empty(self.shape, dtype=self.dtype)
        p = self.producer
        with p.device(self.device):
            stream = p.current_stream(self.device)
            if self.nbytes:
                p.fake.memcpy_async(out.ctypes.data, self.ptr, self.nbytes, stream, 2)
            p.fake.stream_synchronize(stream)
        return out

    cpu = numpy

    # --- DLPack --------------------------------------------------------------

    def __dlpack_device__(self) -> tuple[int, int]:
        self.producer.device_queries += 1
        return (KDL_CUDA, self.device)

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if copy:
            raise BufferError("copy=True is not supported by this double")
        if dl_device is not None and tuple(dl_device) != self.__dlpack_device__():
            raise BufferError(f"cannot export to device {tuple(dl_device)}")
        self._export_checks()
        if stream is not None and type(stream) is not int:
            raise TypeError("stream must be ``int`` or ``none``")
        self._handshake(stream)
        versioned = max_version is not None and tuple(max_version)[0] >= 1
        return _make_capsule(self, versioned)

    def _export_checks(self) -> None:
        pass

    def _handshake(self, stream) -> None:
        raise NotImplementedError

    def _order_before(self, consumer_stream: int) -> None:
        """Torch's handshake: an event on our current stream, waited for by *consumer_stream*."""
        p = self.producer
        p.stream_compares += 1
        current = p.current_stream(self.device)
        consumer = 0 if consumer_stream in (0, 1) else consumer_stream  # 1 (CUDA) / 0: the legacy stream
        if consumer == current:
            return
        with p.device(self.device):
            event = p.fake.event_create()
            try:
                p.fake.event_record(event, current)
                p.fake.stream_wait_event(consumer, event)
            finally:
                p.fake.event_destroy(event)
        p.handshakes += 1


class FakeTorchTensor(FakeDeviceTensor):
    """torch.Tensor's behaviour as a DLPack producer (torch/_tensor.py ``__dlpack__``, 2.5+), its
    CUDA Array Interface (2.11) and its kernel launch check."""

    def _launch_check(self) -> None:
        """C10_CUDA_KERNEL_LAUNCH_CHECK: ``cudaGetLastError()`` (which clears it); an error raises."""
        code = self.producer.fake.get_last_error()
        if code != fake_cuda.SUCCESS:
            raise FakeAcceleratorError(code, self.producer.fake.error_string(code))

    @property
    def __cuda_array_interface__(self) -> dict:
        """torch 2.11's (torch/_tensor.py): version 2, no stream, the dtype's typestr ('<V2' for
        bfloat16), strides None for a compact tensor, data pointer 0 when empty."""
        return {
            "typestr": self.dtype.str,
            "shape": self.shape,
            "strides": None,
            "data": (self.ptr if self.nbytes else 0, False),
            "version": 2,
        }

    def _export_checks(self) -> None:
        current = self.producer.fake.get_device()
        if current != self.device:
            raise BufferError(f"{DEVICE_INDEX_ERROR}. Expected: {self.device}. Current device: {current}.")

    def _handshake(self, stream) -> None:
        if stream == -1:  # no synchronization
            return
        if stream == 2:
            raise BufferError("per-thread default stream is not supported.")
        if stream == 0:
            raise AssertionError("unsupported stream on CUDA: 0.")
        self._order_before(1 if stream is None else stream)  # None: the legacy default stream


class FakeCupyArray(FakeDeviceTensor):
    """cupy.ndarray's behaviour as a producer: CAI v3 and DLPack under its own device."""

    def _handshake(self, stream) -> None:
        if stream == -1:
            return
        self._order_before(1 if stream is None else stream)  # None: the legacy default stream

    @property
    def __cuda_array_interface__(self) -> dict:
        stream = self.producer.current_stream(self.device)
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "descr": [("", self.dtype.str)],
            "data": (self.ptr, self.read_only),
            "strides": None,
            "version": 3,
            "stream": stream if stream else 1,  # 1: the legacy default stream (0 is not allowed)
        }

    get = FakeDeviceTensor.numpy


# --------------------------------------------------------------------------
# Producers
# --------------------------------------------------------------------------


class _Producer:
    tensor_type: type[FakeDeviceTensor] = FakeDeviceTensor
    #: Whether tritonshm knows how to read this library's current stream for its tensors (torch's).
    stream_readable = False
    name = "fake"

    def __init__(self, fake: FakeCudart, *, caching: bool = False, expandable_segments: bool = False):
        # The double's own CUDA calls (its handshakes, allocations, guards) are torch's or cupy's,
        # counted apart from the code under test's (FakeCudart.calls).
        self.fake = fake = fake.as_foreign()
        #: torch's caching allocator double, when *caching* (else every tensor is its own cudaMalloc)
        self.allocator = CachingAllocator(fake, expandable_segments) if caching or expandable_segments else None
        self._local = threading.local()
        self._lock = threading.Lock()
        self._made_streams: list[tuple[int, int]] = []
        #: How many stream handshakes (event recorded + waited) exports did.
        self.handshakes = 0
        #: How many exports were given a stream to order before (anything but -1): each compares it
        #: with the current stream -- in torch, four Python stream look-ups even when they are equal.
        self.stream_compares = 0
        #: How many times tritonshm asked current_stream_provider.
        self.provider_calls = 0
        #: How many times a tensor was asked where it lives (``__dlpack_device__``): torch's is
        #: Python (a torch.device made, an enum looked up), a few microseconds a call on an H200.
        self.device_queries = 0

    def __repr__(self) -> str:
        return f"<{type(self).__name__} over {self.fake.path}>"

    # --- devices -------------------------------------------------------------

    def current_device(self) -> int:
        return self.fake.get_device()

    @contextlib.contextmanager
    def device(self, device: int):
        """Make *device* current; restore the previous one only if it has a context
        (torch's MaybeSetDevice: a guard never creates a context on device 0)."""
        previous = self.fake.get_device()
        if previous == device:
            yield
            return
        self.fake.set_device(device)
        try:
            yield
        finally:
            if self.fake.primary_ctx_active(previous):
                self.fake.set_device(previous)

    # --- streams -------------------------------------------------------------

    def _streams(self) -> dict[int, int]:
        streams = getattr(self._local, "streams", None)
        if streams is None:
            streams = self._local.streams = {}
        return streams

    def current_stream(self, device: int | None = None) -> int:
        """This thread's current stream on *device* (default: the current device); 0 is the legacy one."""
        if device is None:
            device = self.fake.get_device()
        return self._streams().get(device, 0)

    def current_stream_provider(self, device: int) -> int | None:
        """For tritonshm's ``current_stream_providers``: our non-default current stream, else None."""
        self.provider_calls += 1
        return self._streams().get(device) or None

    @contextlib.contextmanager
    def stream(self, device: int | None = None, handle: int | None = None):
        """Make a new non-blocking stream (or *handle*) this thread's current one on *device*; yields it."""
        if device is None:
            device = self.fake.get_device()
        if handle is None:
            with self.device(device):
                handle = self.fake.stream_create(fake_cuda.STREAM_NON_BLOCKING)
            with self._lock:
                self._made_streams.append((device, handle))
        streams = self._streams()
        previous = streams.get(device)
        streams[device] = handle
        try:
            yield handle
        finally:
            if previous is None:
                streams.pop(device, None)
            else:
                streams[device] = previous

    def synchronize(self, device: int | None = None) -> None:
        """torch.cuda.synchronize(device): wait for all work of the device."""
        if device is None:
            device = self.fake.get_device()
        with self.device(device):
            self.fake.device_synchronize()

    def close(self) -> None:
        """Destroy the streams this double made (their queued work still lands)."""
        with self._lock:
            made, self._made_streams = self._made_streams, []
        for _, handle in made:
            self.fake.stream_destroy(handle)

    # --- tensors ---------------------------------------------------------------

    def _device_arg(self, device) -> int:
        if device is None:
            return self.fake.get_device()
        if isinstance(device, str):  # "cuda:1" / "cuda"
            _, _, index = device.partition(":")
            return int(index) if index else self.fake.get_device()
        return int(device)

    def empty(self, shape, dtype="float32", device=None) -> FakeDeviceTensor:
        device = self._device_arg(device)
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
        with self.device(device):
            ptr = self.fake.malloc(max(nbytes, 1)) if self.allocator is None \
                else self.allocator.malloc(max(nbytes, 1), device)
        t = self.tensor_type(self, ptr, shape, dtype, device)
        t.storage = storage = _Storage()
        if self.allocator is None:
            weakref.finalize(storage, _free_device_memory, weakref.ref(self), self.fake, ptr, device)
        else:
            weakref.finalize(storage, _free_block, self.allocator, ptr)
        return t

    def empty_cache(self) -> int:
        """``torch.cuda.empty_cache()`` (caching producers): segments freed."""
        return 0 if self.allocator is None else self.allocator.empty_cache()

    def zeros(self, shape, dtype="float32", device=None) -> FakeDeviceTensor:
        return self.empty(shape, dtype, device).fill_(0)

    def from_numpy(self, array, device=None) -> FakeDeviceTensor:
        """A device copy of *array*, queued on the current stream (like ``torch.tensor(a, device=...)``)."""
        array = np.ascontiguousarray(array)
        return self.empty(array.shape, array.dtype, device).copy_(array)

    # --- consuming ------------------------------------------------------------

    def from_dlpack(self, obj) -> FakeDeviceTensor:
        """torch.from_dlpack(obj): our current stream for its device is passed, the capsule
        is held until the returned tensor dies (its deleter runs then)."""
        device_type, device_id = obj.__dlpack_device__()
        if device_type != KDL_CUDA:
            raise BufferError(f"{type(self).__name__} consumes CUDA memory only, not device type {device_type}")
        current = self.current_stream(device_id)
        kwargs = {"max_version": (1, 0), "stream": current if current else 1}
        try:
            capsule = obj.__dlpack__(**kwargs)
        except TypeError:
            kwargs.pop("max_version")
            capsule = obj.__dlpack__(**kwargs)
        versioned = _PyCapsule_GetName(capsule) == b"dltensor_versioned"
        address, managed, deleter = fake_cuda.consume_dlpack(capsule, versioned=versioned)
        dl = managed.dl_tensor
        try:
            if dl.device_type != KDL_CUDA:
                raise BufferError(f"capsule on device type {dl.device_type}")
            shape = tuple(dl.shape[i] for i in range(dl.ndim))
            dtype = _np_dtype(dl.code, dl.bits, dl.lanes)
            if dl.strides:
                expected = np.empty(shape, dtype).strides
                strides = tuple(dl.strides[i] * dtype.itemsize for i in range(dl.ndim))
                if any(n > 1 and s != e for n, s, e in zip(shape, strides, expected)):
                    raise BufferError("this double takes compact arrays only")
            read_only = versioned and bool(managed.flags & 1)
            t = self.tensor_type(self, (dl.data or 0) + dl.byte_offset, shape, dtype, dl.device_id,
                                 read_only=read_only)
        except BaseException:
            if managed.deleter:
                deleter(address)
            raise
        t.capsule = capsule  # held until the tensor dies
        if managed.deleter:
            weakref.finalize(t, deleter, address)
        return t


class TorchLike(_Producer):
    """A torch double: tensors refuse DLPack export from a non-current device (and streams 0 and 2).

    tritonshm reads torch's own current stream for a torch tensor (``producer_stream_of``): the
    ``torch_like`` fixtures put this double's ``current_stream`` there for its tensor type."""

    tensor_type = FakeTorchTensor
    name = "torch-like"
    #: Whether tritonshm knows how to read this library's current stream for its tensors.
    stream_readable = True

    def tensor(self, data, dtype=None, device=None) -> FakeTorchTensor:
        return self.from_numpy(np.asarray(data, dtype=dtype), device)


class CupyLike(_Producer):
    """A cupy double: arrays with ``__cuda_array_interface__`` v3 and DLPack (``None``: legacy stream)."""

    tensor_type = FakeCupyArray
    name = "cupy-like"

    def asarray(self, data, dtype=None, device=None) -> FakeCupyArray:
        return self.from_numpy(np.asarray(data, dtype=dtype), device)
