"""bench/client_overhead.py's accounting of the torch-like double's own CPU (FAKE runtime).

``--gpu`` reports each row also less what the double's Python took (torch does that work in C++):
the accounting must count the double's calls, only those, and leave the double and tritonshm's
stream look-ups as they were.
"""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

import numpy as np

from tritonshm._memory import _stream
from tritonshm.client import _devices

BENCH = Path(__file__).resolve().parents[2] / "bench" / "client_overhead.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("client_overhead_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_doubles_own_cpu_is_counted_and_the_double_left_as_it_was(fake_cuda, torch_like):
    import fake_producers

    bench = load_bench()
    kind = torch_like.tensor_type
    deleters = fake_producers._DELETER, fake_producers._CAPSULE_DESTRUCTOR
    before = (dict(kind.__dict__), set(vars(torch_like)), list(_stream.current_stream_providers),
              dict(_stream.producer_streams))
    x = torch_like.from_numpy(np.arange(64, dtype=np.float32))
    with bench._the_doubles_cpu(torch_like) as (not_ours, timing):
        assert 0 < timing < 100_000  # ns a timed call costs outside its window: a Python call, two clock reads
        end = time.thread_time_ns() + 2_000_000
        while time.thread_time_ns() < end:  # 2 ms of CPU that is not the double's
            pass
        assert not_ours() == 0
        with _devices.one_ordering_point():
            tensor = _devices.as_device_tensor(x)  # its exports and stream look-ups: the double's
        assert 0 < not_ours() < 2_000_000
        counted = not_ours()
        tensor.source.release()  # the double's deleter: a ctypes callback into its Python
        assert not_ours() > counted
        counted = not_ours()
        torch_like.empty(64, np.float32)
        assert not_ours() > counted
    after = (dict(kind.__dict__), set(vars(torch_like)), list(_stream.current_stream_providers),
             dict(_stream.producer_streams))
    assert after == before
    assert (fake_producers._DELETER, fake_producers._CAPSULE_DESTRUCTOR) == deleters
