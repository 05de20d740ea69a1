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
