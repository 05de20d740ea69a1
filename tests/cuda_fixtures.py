"""CUDA fixtures (loaded from conftest.py): the FAKE runtime for CI, the real GPU where there is one.

* ``fake_cuda`` makes the fake runtime (tests/fake_cudart, built here with
  the C compiler, never shipped) tritonshm's current runtime for one test,
  and fails the test if device memory, IPC opens or host registrations it
  made are still outstanding at the end.  It runs everywhere, GPU or not:
  regions keep the runtime they were made with, so the real one is untouched.
* ``torch_like`` / ``cupy_like`` are producer doubles (tests/fake_producers.py)
  over ``fake_cuda``: torch's and cupy's per-thread current streams, async
  writes, DLPack/CAI stream handshakes and device refusal, without either
  library.  While the test runs, each is the first of tritonshm's
  ``_stream.current_stream_providers`` (where that exists).  Not imported by
  conftest.py yet: ``from cuda_fixtures import torch_like, cupy_like``.
* ``fake_cuda_server`` is a real Triton server whose CUDA calls go to the
  fake (``LD_PRELOAD``), so it opens the fake handles tritonshm exports.
* ``gpu`` skips a test unless a real CUDA GPU is usable; tests that need it
  carry ``@pytest.mark.gpu`` too, so ``pytest -m gpu`` selects them.
* ``torch`` and ``cupy`` are those modules, skipping a test where one is not
  installed (or torch sees no CUDA device).
"""

from __future__ import annotations

import contextlib
import ctypes
import gc

import pytest

from fake_cuda import FakeCudart, build_fake_cudart, server_env
from triton_fixtures import make_client, start_or_skip


@pytest.fixture(scope="session")
def fake_cudart_path(tmp_path_factory):
    """The fake runtime's shared library, built once per session."""
    return build_fake_cudart(tmp_path_factory.mktemp("fake-cudart"))


@pytest.fixture
def fake_cuda(fake_cudart_path, monkeypatch, request):
    """The FAKE CUDA runtime as tritonshm's current one; yields its ctypes driver.

    ``TRITONSHM_CUDART`` points at it too, so child processes (attach,
    pickling) load the same fake.  At the end: work still queued fails the
    test (and is dropped, never landed in a later test), so does an error
    left on the thread's CUDA last error (torch's next kernel launch would
    raise it; the test starts with none), the thread goes back to device 0,
    and the test fails if it leaked allocations, IPC opens or host
    registrations, if queued work found its memory unmapped (``lost_ops``),
    or if memory another process (the server) had open was freed
    (``freed_while_open``) -- unless the test is marked ``freed_on_purpose``.
    """
    from tritonshm._memory import _runtime

    monkeypatch.setenv("TRITONSHM_CUDART", str(fake_cudart_path))
    fake = FakeCudart(fake_cudart_path)
    fake.get_last_error()  # a failure an earlier test provoked on this thread is not this test's
    before = fake.stats()
    previous = _runtime.use(str(fake_cudart_path))
    try:
        yield fake
    finally:
        _runtime.use(previous)
        # Work left queued at the end is a bug (of the code under test, or of a test that
        # forgot to synchronize what it queued): it fails the test.  It is dropped either way,
        # never landed in a later test (its destination may be freed memory by then).
        left_queued = fake.pending()
        fake.discard_pending()
        left_error = fake.get_last_error()
        # The current device is per thread and outlives the test (a guard may
        # leave this thread on the device it entered): the next test starts on 0.
        device = ctypes.c_int(0)
        if fake.lib.cudaGetDevice(ctypes.byref(device)) == 0 and device.value != 0:
            fake.lib.cudaSetDevice(0)
    gc.collect()
    after = fake.stats()
    if left_queued:
        pytest.fail(f"fake CUDA: {left_queued} operations were still queued at the end of the test "
                    f"(work nobody waited for: a copy out of a slot that went back, a result "
                    f"handed out unfinished)", pytrace=False)
    if left_error:
        pytest.fail(f"fake CUDA: the thread's last error was {fake.error_name(left_error)} at the end of the "
                    f"test (torch's next kernel launch would raise it)", pytrace=False)
    if after.live != before.live:
        pytest.fail(f"fake CUDA leak check: (allocations, IPC opens, host registrations) went "
                    f"from {before.live} to {after.live}", pytrace=False)
    if after.lost_ops != before.lost_ops:
        pytest.fail(f"fake CUDA: {after.lost_ops - before.lost_ops} queued copies found their memory "
                    f"unmapped when they landed (memory freed while the GPU still had work on it)",
                    pytrace=False)
    if after.freed_while_open != before.freed_while_open and "freed_on_purpose" not in request.keywords:
        pytest.fail(f"fake CUDA: {after.freed_while_open - before.freed_while_open} allocations were freed "
                    f"while another process (the server) had them open", pytrace=False)


@contextlib.contextmanager
def current_stream_provider(provider):
    """Put *provider* first in tritonshm's ``_stream.current_stream_providers`` while in the
    block (the list is changed in place: tritonshm reads it at each call); nothing where
    this tritonshm has no such list."""
    try:
        from tritonshm._memory import _stream
    except ImportError:
        providers = None
    else:
        providers = getattr(_stream, "current_stream_providers", None)
    if providers is None:
        yield None
        return
    providers.insert(0, provider)
    try:
        yield providers
    finally:
        providers.remove(provider)


@contextlib.contextmanager
def producer_stream_reader(producer):
    """Let tritonshm read *producer*'s current stream for its tensors while in the block (what
    ``producer_stream_of`` finds by itself for torch's), where the double says torch would."""
    try:
        from tritonshm._memory import _stream
    except ImportError:
        readers = None
    else:
        readers = getattr(_stream, "producer_streams", None)
    if readers is None or not producer.stream_readable:
        yield
        return
    readers[producer.tensor_type] = producer.current_stream
    try:
        yield
    finally:
        readers.pop(producer.tensor_type, None)


def _producer_double(cls, fake, **allocator):
    producer = cls(fake, **allocator)
    try:
        with current_stream_provider(producer.current_stream_provider), producer_stream_reader(producer):
            yield producer
    finally:
        producer.close()
        gc.collect()  # tensors the test dropped free their memory before fake_cuda's leak check
        producer.empty_cache()  # a caching double's segments, once every tensor is gone


@pytest.fixture
def torch_like(fake_cuda):
    """A torch-like producer double (fake_producers.TorchLike) on the FAKE runtime,
    registered as tritonshm's first current-stream provider for the test."""
    from fake_producers import TorchLike

    yield from _producer_double(TorchLike, fake_cuda)




@pytest.fixture
def torch_caching(fake_cuda):
    """A torch-like double whose tensors are blocks of a caching allocator's segments
    (fake_producers.CachingAllocator): torch's default memory, as far as lifetimes go."""
    from fake_producers import TorchLike

    yield from _producer_double(TorchLike, fake_cuda, caching=True)


@pytest.fixture
def torch_expandable(fake_cuda):
    """The same with ``expandable_segments:True``: segments CUDA IPC cannot export."""
    from fake_producers import TorchLike

    yield from _producer_double(TorchLike, fake_cuda, expandable_segments=True)


@pytest.fixture
def cupy_like(fake_cuda):
    """A cupy-like producer double (fake_producers.CupyLike) on the FAKE runtime,
    registered as tritonshm's first current-stream provider for the test."""
    from fake_producers import CupyLike

    yield from _producer_double(CupyLike, fake_cuda)


@pytest.fixture
def cupy_async_pool(fake_cuda):
    """A cupy-like double allocating from a stream-ordered pool (cupy's ``MemoryAsyncPool``:
    the fake's cudaMallocAsync), memory CUDA IPC cannot export."""
    from fake_producers import CupyLike

    yield from _producer_double(CupyLike, fake_cuda, expandable_segments=True)


@pytest.fixture(scope="session")
def fake_cuda_server(fake_cudart_path):
    """A LocalServer whose CUDA runtime calls go to the FAKE runtime (it opens our fake handles)."""
    from tritonshm.server import LocalServer

    with start_or_skip(LocalServer(env=server_env(fake_cudart_path))) as srv:
        for protocol in ("grpc", "http"):  # warm each client's machinery before the leak checks
            _, client = make_client(srv, protocol)
            client.is_server_live()
            client.close()
        yield srv


@pytest.fixture(scope="session")
def gpu():
    """The real CUDA runtime; skips the test where no GPU is usable.

    Creates device 0's context (and torch's and cupy's, where installed)
    before the first leak check: the driver's descriptors and threads live
    as long as the process, and are no test's leak.
    """
    from tritonshm import cuda
    from tritonshm._memory import _runtime

    info = cuda.runtime_info()
    if not info["available"]:
        pytest.skip(f"no CUDA GPU: {info['error']}")
    _runtime.current().mem_info(0)
    try:
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device="cuda")
    except ImportError:
        pass
    try:
        import cupy

        cupy.zeros(1)
    except ImportError:
        pass
    return info


@pytest.fixture
def torch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch sees no CUDA device")
    return torch


@pytest.fixture
def cupy():
    return pytest.importorskip("cupy")
