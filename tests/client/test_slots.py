"""tritonshm.client._slots: the copy a large input or output takes, split across threads."""

from __future__ import annotations

import numpy as np
import pytest

from tritonshm.client import _slots


@pytest.fixture
def split_always(monkeypatch):
    """Every copy above a page takes the threaded way, whatever this machine's cores."""
    monkeypatch.setattr(_slots, "_PARALLEL_COPY_BYTES", 4096)
    monkeypatch.setattr(_slots, "_COPY_THREADS", 3)


@pytest.mark.parametrize("nbytes", [4096, 4096 * 3 + 4, 9 << 20, (9 << 20) + 12])
def test_a_split_copy_is_the_whole_copy(split_always, nbytes):
    src = np.random.default_rng(nbytes).integers(0, 2**31, nbytes // 4, dtype=np.int32).reshape(-1, 1)
    dst = np.zeros_like(src)
    _slots.parallel_copy(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_what_the_threads_cannot_split_is_copied_as_numpy_would(split_always):
    src = np.arange(1 << 16, dtype=np.float32)
    strided = np.zeros(1 << 17, np.float32)[::2]            # not contiguous: one np.copyto
    _slots.parallel_copy(strided, src)
    np.testing.assert_array_equal(strided, src)
    with pytest.raises(TypeError):                          # no silent cast, as np.copyto(casting="no")
        _slots.parallel_copy(np.zeros(1 << 16, np.float64), src)
    with pytest.raises(ValueError):                         # shapes that do not broadcast
        _slots.parallel_copy(np.zeros(1 << 15, np.float32), src)


@pytest.mark.parametrize("contiguous", [True, False])
def test_a_host_input_written_to_a_cuda_slot_is_read_whole_when_its_copy_lands(fake_cuda, contiguous):
    """CUDA may read pageable host memory when an asynchronous copy lands, not at the call (it
    "might be synchronous"; the fake reads it then): the bytes that land are the input's, never
    those of a temporary freed meanwhile (a non-contiguous input's contiguous copy)."""
    import gc

    from tritonshm._memory._stream import copy_stream

    base = np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)
    given = np.ascontiguousarray(base[:, ::2]) if contiguous else base[:, ::2]  # 1 MiB either way
    memory = _slots.CudaSlotMemory(given.nbytes, 0)
    try:
        stream = copy_stream(0)
        memory.write(0, given, stream)  # queued on the request's stream, waited for before sending
        gc.collect()
        junk = [np.full(given.nbytes, 0xEE, np.uint8) for _ in range(4)]  # freed heap, handed out again
        stream.synchronize()
        del junk
        np.testing.assert_array_equal(memory.copy_out(0, np.dtype(np.float32), given.shape), given)
    finally:
        memory.close()
