"""tritonshm.Client against a real Triton server, over gRPC and HTTP."""

from __future__ import annotations

import concurrent.futures
import gc
import mmap
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
import warnings

import numpy as np
import pytest

import tritonshm
from tritonshm.client._slots import SYSTEM, SlotKind  # noqa: F401 (the private pool keys)
from triton_fixtures import (refuse_unregister, NUMERIC_IDENTITY_MODELS, client_url, restarted_unable_to_open_our_memory,
                             sample, start_or_skip)
from support.insides import live_pool, live_pools, run_finalizer


@pytest.fixture
def client(server, protocol):
    with tritonshm.Client(client_url(server, protocol)) as c:
        yield c


def floats(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# -- discovery -------------------------------------------------------------


def test_model_info_is_read_from_the_server_and_cached(client):
    info = client.model_info("batched_fp32")
    assert info.max_batch_size == 8 and info.batched
    assert [(t.name, t.datatype, t.dims) for t in info.inputs] == [("INPUT0", "FP32", (4,))]
    assert [(t.name, t.datatype, t.dims) for t in info.outputs] == [("OUTPUT0", "FP32", (4,))]
    assert client.model_info("batched_fp32") is info
    variable = client.model_info("variable_fp32")
    assert variable.max_batch_size == 0 and variable.inputs[0].dims == (-1, -1)


def test_unknown_model_is_a_clear_server_error(client):
    with pytest.raises(tritonshm.ServerError, match="no_such_model"):
        client.infer("no_such_model", {"INPUT0": floats(4)})


# -- inference -------------------------------------------------------------

@pytest.mark.parametrize("model", sorted(NUMERIC_IDENTITY_MODELS))
def test_every_dtype_round_trips(client, model):
    data = sample(NUMERIC_IDENTITY_MODELS[model], 1000)
    out = client.infer(model, {"INPUT0": data})
    assert out["OUTPUT0"].dtype == data.dtype
    assert np.array_equal(out["OUTPUT0"], data)


def test_bytes_tensors_round_trip(client):
    data = np.array([b"a", b"", "\u00e9".encode(), b"\x00" * 100], dtype=object)
    out = client.infer("identity_bytes", {"INPUT0": data})
    assert list(out["OUTPUT0"]) == list(data)


def test_two_inputs_two_outputs_and_output_selection(client):
    a, b = floats(16, seed=1), floats(16, seed=2)
    out = client.infer("add_sub", {"INPUT0": a, "INPUT1": b})
    assert np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)
    only = client.infer("add_sub", {"INPUT0": a, "INPUT1": b}, outputs=["OUTPUT1"])
    assert list(only) == ["OUTPUT1"] and np.array_equal(only["OUTPUT1"], a - b)


def test_empty_outputs_means_every_output_as_in_tritonclient(client):
    a, b = floats(16, seed=1), floats(16, seed=2)
    out = client.infer("add_sub", {"INPUT0": a, "INPUT1": b}, outputs=[])
    assert sorted(out) == ["OUTPUT0", "OUTPUT1"]
    assert np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)


def test_accepts_array_likes_with_the_right_dtype(client):
    out = client.infer("identity_int64", {"INPUT0": [1, 2, 3]})
    assert out["OUTPUT0"].tolist() == [1, 2, 3]
    # A non-contiguous input is copied into the slot once, correctly.
    strided = np.arange(20, dtype=np.float32)[::2]
    assert np.array_equal(client.infer("identity_fp32", {"INPUT0": strided})["OUTPUT0"], strided)


def test_bad_inputs_are_refused_before_anything_is_sent(client):
    with pytest.raises(tritonshm.DTypeMismatch, match="'INPUT0'.*FP32.*float64") as exc:
        client.infer("identity_fp32", {"INPUT0": np.zeros(4)})
    assert isinstance(exc.value, TypeError)
    with pytest.raises(tritonshm.DTypeMismatch, match="no silent casts"):
        client.infer("identity_fp32", {"INPUT0": [1.0, 2.0]})
    with pytest.raises(tritonshm.ShapeMismatch, match=r"\[-1, 4\]") as exc:
        client.infer("batched_fp32", {"INPUT0": floats(2, 5)})
    assert isinstance(exc.value, ValueError)
    with pytest.raises(tritonshm.ShapeMismatch, match=r"\[16\]"):
        client.infer("add_sub", {"INPUT0": floats(15), "INPUT1": floats(15)})
    # a name the model lacks has its own class (a ShapeMismatch still: except clauses keep working)
    with pytest.raises(tritonshm.NameMismatch, match=r"takes inputs \['INPUT0', 'INPUT1'\]; missing.*INPUT1"):
        client.infer("add_sub", {"INPUT0": floats(16)})
    with pytest.raises(tritonshm.NameMismatch, match="unknown.*BOGUS") as named:
        client.infer("identity_fp32", {"INPUT0": floats(4), "BOGUS": floats(4)})
    assert isinstance(named.value, tritonshm.ShapeMismatch)
    with pytest.raises(tritonshm.NameMismatch, match=r"has outputs \['OUTPUT0'\]; unknown.*NOPE"):
        client.infer("identity_fp32", {"INPUT0": floats(4)}, outputs=["NOPE"])


def test_an_empty_batch_is_refused_before_anything_is_sent(client):
    with pytest.raises(tritonshm.ShapeMismatch, match=r"input 'INPUT0' of model 'batched_fp32'.*0 rows.*at least one"):
        client.infer("batched_fp32", {"INPUT0": floats(0, 4)})
    assert not live_pools(client)  # no slot made, nothing sent


def test_large_batches_are_chunked_and_reassembled_in_order(client):
    batch = floats(100, 4)  # max_batch_size is 8: 13 chunks over 4 slots
    out = client.infer("batched_fp32", {"INPUT0": batch})
    assert out["OUTPUT0"].shape == (100, 4)
    assert np.array_equal(out["OUTPUT0"], batch * 2)
    with pytest.raises(ValueError, match="copy=False"):
        client.infer("batched_fp32", {"INPUT0": batch}, copy=False)


def test_unbatched_models_are_not_chunked(client):
    data = floats(200_000)
    assert np.array_equal(client.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)


def test_variable_dims_grow_the_pool_and_retire_the_old_one(client):
    small, large = floats(2, 3), floats(64, 128)
    assert np.array_equal(client.infer("variable_fp32", {"INPUT0": small})["OUTPUT0"], small + 1)
    first = live_pool(client, "variable_fp32")
    (first_extent,) = first.extents
    assert np.array_equal(client.infer("variable_fp32", {"INPUT0": large})["OUTPUT0"], large + 1)
    second = live_pool(client, "variable_fp32")
    assert second is not first and second.layout.slot_bytes > first.layout.slot_bytes
    # every slot was back, so it was unregistered and closed at once
    assert first.closed and first_extent.memory.region.closed
    names = tritonshm.status(client.tritonclient)
    assert second.extents[0].name in names and first_extent.name not in names
    # Smaller requests keep using the larger pool.
    assert np.array_equal(client.infer("variable_fp32", {"INPUT0": small})["OUTPUT0"], small + 1)
    assert live_pool(client, "variable_fp32") is second


def test_a_replaced_pool_sends_late_requests_to_its_successor(client):
    """A request that looked the pool up just before another one replaced it
    must not lease from the old, unregistered region (many threads do race so)."""
    small, large = floats(4), floats(4096)
    client.infer("identity_fp32", {"INPUT0": small})
    old = live_pool(client, "identity_fp32")
    client.infer("identity_fp32", {"INPUT0": large})  # grows: the old pool is dropped
    assert old.closed and old.extents == []
    assert old.try_acquire() is None and old.wait(timeout=5)  # retired: waiters move on at once
    assert np.array_equal(client.infer("identity_fp32", {"INPUT0": small})["OUTPUT0"], small)


def test_undersized_variable_output_is_grown_and_retried(client):
    data = floats(1000)
    out = client.infer("tile_fp32", {"INPUT0": data})  # output is twice the input
    assert np.array_equal(out["OUTPUT0"], np.concatenate([data, data]))


@pytest.mark.parametrize("options", [{"idempotent": False}])
def test_an_output_that_outgrew_its_guess_is_not_run_again_when_that_would_do_harm(client, options):
    """Triton says an output did not fit after the model ran: a request that may not run twice
    (marked so, or in a sequence) gets the error, saying how much room was needed, and is not
    sent again on a larger slot."""
    data = floats(1000)
    with pytest.raises(tritonshm.OutputTooSmall) as err:
        client.infer("tile_fp32", {"INPUT0": data}, **options)
    assert err.value.output == "OUTPUT0" and err.value.needed == 2 * data.nbytes
    assert np.array_equal(client.infer("tile_fp32", {"INPUT0": data})["OUTPUT0"], np.concatenate([data, data]))


def test_infer_async_returns_a_future(client):
    data = floats(64)
    futures = [client.infer_async("identity_fp32", {"INPUT0": data + i}) for i in range(10)]
    assert all(isinstance(f, concurrent.futures.Future) for f in futures)
    for i, f in enumerate(futures):
        assert np.array_equal(f.result(timeout=60)["OUTPUT0"], data + i)


# -- the zero-copy path and slot lifetimes ---------------------------------


def test_request_gives_views_into_the_slot(client):
    with client.request("batched_fp32", batch_size=3) as req:
        x = req.inputs["INPUT0"]
        assert x.shape == (3, 4) and x.dtype == np.float32 and x.flags.writeable
        x[:] = floats(3, 4)
        out = req.run()
        assert np.array_equal(out["OUTPUT0"], x * 2)
        # Running again on changed inputs reuses the slot.
        x += 1
        again = req.run()
        with pytest.raises(TypeError):  # an input rebound rather than filled: never silently ignored
            req.inputs["INPUT0"] = floats(3, 4)  # type: ignore[index]
    assert np.array_equal(again["OUTPUT0"], x * 2)
    assert not out["OUTPUT0"].flags.owndata  # a view of the slot, not a copy


def test_runs_of_one_request_ask_each_for_its_own_outputs_and_options(server, protocol):
    """A request keeps the message of its usual run (every output, no options of its own) after the
    first: a run asking for some outputs, or with options, is sent as asked, and the usual run
    after it as before -- on a client with default options too (headers: its message made per run)."""
    a, b = floats(16, seed=1), floats(16, seed=2)
    for defaults in ({}, {"headers": {"x-test": "1"}}):  # (headers: the client's default options)
        with tritonshm.Client(client_url(server, protocol), **defaults) as c, c.request("add_sub") as req:
            req.inputs["INPUT0"][:], req.inputs["INPUT1"][:] = a, b
            for _ in range(2):  # (the second time with what the first kept)
                assert sorted(req.run()) == ["OUTPUT0", "OUTPUT1"]
                only = req.run(outputs=["OUTPUT1"])
                assert list(only) == ["OUTPUT1"] and np.array_equal(only["OUTPUT1"], a - b)
                usual = req.run()
                assert sorted(usual) == ["OUTPUT0", "OUTPUT1"] and np.array_equal(usual["OUTPUT0"], a + b)
                assert sorted(req.run(timeout=10_000_000)) == ["OUTPUT0", "OUTPUT1"]


def test_a_warm_requests_answer_the_same_as_the_last_is_parsed_and_read_once(server, protocol, monkeypatch):
    """A request made ready goes as the bytes made once, and an answer to it that is the same, byte
    for byte, as the last one (a warm request's is) is the result made of that one, its output
    shapes read then: runs of a zero-copy request, and the quick numpy path on its slot, make one
    result and read its shapes once -- not once a call."""
    from tritonshm import _http1, _tritonclient_compat
    from tritonshm.client import _results

    made, read = [], []
    if protocol == "http":
        class CountedJSON(_http1.Result):
            __slots__ = ()

            def __init__(self, response):
                made.append(response)
                super().__init__(response)

        monkeypatch.setattr(_http1, "Result", CountedJSON)
    else:
        grpc, infer_result, raise_error = _tritonclient_compat.grpc_parts()

        class CountedResult(infer_result):
            def __init__(self, response):
                made.append(response)
                super().__init__(response)

        monkeypatch.setattr(_tritonclient_compat, "grpc_parts", lambda: (grpc, CountedResult, raise_error))
    real_shape = _results.answered_shape

    def counted_shape(info, result, name, spec=None):
        read.append(name)
        return real_shape(info, result, name, spec)

    monkeypatch.setattr(_results, "answered_shape", counted_shape)
    a, b = floats(16, seed=1), floats(16, seed=2)
    with tritonshm.Client(client_url(server, protocol), slots=1) as c:
        with c.request("add_sub") as req:
            req.inputs["INPUT0"][:], req.inputs["INPUT1"][:] = a, b
            for _ in range(5):
                out = req.run()
                assert np.array_equal(out["OUTPUT0"], a + b) and np.array_equal(out["OUTPUT1"], a - b)
        assert len(made) == 1 and sorted(read) == ["OUTPUT0", "OUTPUT1"]
        x = floats(16, seed=3)
        for _ in range(3):  # planned, then quick on the one slot
            assert np.array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        made_then, read_then = len(made), len(read)
        for _ in range(5):
            assert np.array_equal(c.infer("identity_fp32", {"INPUT0": x})["OUTPUT0"], x)
        assert (len(made), len(read)) == (made_then, read_then)


def test_request_checks_its_arguments(client):
    with pytest.raises(tritonshm.ShapeMismatch, match="batch_size"):
        client.request("batched_fp32", batch_size=9)
    with pytest.raises(tritonshm.ShapeMismatch, match="does not batch"):
        client.request("identity_fp32", batch_size=2)
    with pytest.raises(tritonshm.ShapeMismatch, match="shapes="):
        client.request("variable_fp32")
    with client.request("variable_fp32", shapes={"INPUT0": (5, 7)}) as req:
        req.inputs["INPUT0"][:] = 1
        assert np.array_equal(req.run()["OUTPUT0"], np.full((5, 7), 2, np.float32))


def test_slot_returns_only_when_every_view_is_gone(server, protocol):
    # A byte cap of one page leaves no room to grow: held views must be waited for.
    with tritonshm.Client(client_url(server, protocol), slots=1, max_pool_bytes=mmap.PAGESIZE) as c:
        data = floats(16)
        view = c.infer("identity_fp32", {"INPUT0": data}, copy=False)["OUTPUT0"]
        derived = view[4:8]  # a view of the view also holds the slot
        del view
        with pytest.raises(tritonshm.PoolExhausted, match="byte cap.*1 slots held by live result views") as exc:
            c.infer("identity_fp32", {"INPUT0": data}, slot_timeout=0.2)
        assert isinstance(exc.value, TimeoutError)
        assert np.array_equal(derived, data[4:8])
        del derived
        gc.collect()
        assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data}, slot_timeout=5)["OUTPUT0"], data)


def test_held_results_grow_the_pool_instead_of_blocking(server, protocol):
    """12 kept results from a 4-slot pool: no waiting (a timeout of 0 would
    raise), each result intact; once they are dropped the surplus goes back."""
    with tritonshm.Client(client_url(server, protocol), slots=4, slot_timeout=0) as c:
        inputs = [floats(64, seed=i) for i in range(12)]
        kept = [c.infer("identity_fp32", {"INPUT0": x}, copy=False)["OUTPUT0"] for x in inputs]
        pool = live_pool(c, "identity_fp32")
        assert pool.nslots == 12 and len(pool.extents) == 3
        names = tritonshm.status(c.tritonclient)
        assert all(extent.name in names for extent in pool.extents)
        for x, view in zip(inputs, kept):
            assert np.array_equal(view, x)
        surplus = pool.extents[1:]
        del kept, view
        gc.collect()
        c.infer("identity_fp32", {"INPUT0": inputs[0]})  # a request tidies up what fell idle
        assert len(pool.extents) == 1 and pool.nslots == 4
        assert all(extent.memory.region.closed for extent in surplus)
        names = tritonshm.status(c.tritonclient)
        assert not any(extent.name in names for extent in surplus)


def test_exhaustion_by_requests_in_flight_says_so(server):
    with tritonshm.Client(server.grpc_url, slots=1, slot_timeout=0.1) as c:
        data = floats(8)
        slow = c.infer_async("slow_fp32", {"INPUT0": data})  # holds the only slot for 0.5 s
        time.sleep(0.2)
        with pytest.raises(tritonshm.PoolExhausted, match="1 requests in flight fill it"):
            c.infer("slow_fp32", {"INPUT0": data})
        assert np.array_equal(slow.result(timeout=30)["OUTPUT0"], data)


def test_a_pool_is_closed_once_however_often_it_is_closed(client):
    client.infer("identity_fp32", {"INPUT0": floats(4)})
    pool = live_pool(client, "identity_fp32")
    (extent,) = pool.extents
    assert pool.close() == [extent]  # the client unregisters what close() hands back...
    assert pool.close() == [] and pool.take_disposals() == []  # ...exactly once
    pool.retire()
    assert pool.take_disposals() == []
    extent.memory.close()
    live_pools(client).clear()


def test_copy_false_results_survive_many_later_requests(server, protocol):
    with tritonshm.Client(client_url(server, protocol), slots=4) as c:
        kept = [(floats(256, seed=i), None) for i in range(3)]
        kept = [(x, c.infer("identity_fp32", {"INPUT0": x}, copy=False)["OUTPUT0"]) for x, _ in kept]
        for i in range(60):  # only one slot left for these
            noise = floats(256, seed=100 + i)
            assert np.array_equal(c.infer("identity_fp32", {"INPUT0": noise})["OUTPUT0"], noise)
        for x, view in kept:
            assert np.array_equal(view, x)


def test_waiting_request_gets_a_slot_when_views_go(server, protocol):
    with tritonshm.Client(client_url(server, protocol), slots=1) as c:
        data = floats(8)
        held = c.infer("identity_fp32", {"INPUT0": data}, copy=False)
        released = threading.Timer(0.3, held.clear)  # drop the views from another thread
        released.start()
        out = c.infer("identity_fp32", {"INPUT0": data}, slot_timeout=30)
        released.join()
        assert np.array_equal(out["OUTPUT0"], data)


def test_results_outlive_the_client(server, protocol):
    c = tritonshm.Client(client_url(server, protocol))
    data = floats(32)
    view = c.infer("identity_fp32", {"INPUT0": data}, copy=False)["OUTPUT0"]
    c.close()
    c.close()  # idempotent
    assert np.array_equal(view, data)  # its memory stays mapped while the view lives
    with pytest.raises(tritonshm.Error, match="closed"):
        c.infer("identity_fp32", {"INPUT0": data})


# -- threads ---------------------------------------------------------------


def test_many_threads_share_one_client_and_keep_their_data_apart(server, protocol):
    threads, per_thread = 8, 200
    with tritonshm.Client(client_url(server, protocol), slots=4) as c:

        def worker(t):
            rng = np.random.default_rng(t)
            for i in range(per_thread):
                x = rng.standard_normal(rng.integers(1, 512)).astype(np.float32)
                x[0] = t * 1000 + i  # a signature: each result must be this request's
                out = c.infer("identity_fp32_2inst", {"INPUT0": x})["OUTPUT0"]
                if not np.array_equal(out, x):
                    return f"thread {t} request {i} got someone else's data"
            return None

        with concurrent.futures.ThreadPoolExecutor(threads) as pool:
            problems = [p for p in pool.map(worker, range(threads)) if p]
    assert problems == []


# -- self-healing ----------------------------------------------------------


def test_server_restart_mid_stream_reregisters(fresh_server, protocol):
    with tritonshm.Client(client_url(fresh_server, protocol)) as c:
        data = floats(128)
        for i in range(5):
            assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data + i})["OUTPUT0"], data + i)
        fresh_server.restart()
        for i in range(5):
            assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data - i})["OUTPUT0"], data - i)
        pool = live_pool(c, "identity_fp32")
        assert pool.extents[0].name in tritonshm.status(c.tritonclient)


def test_a_server_restarted_unable_to_open_our_memory_is_fallen_back_from(fresh_server, protocol):
    """transport="auto" falls back to the wire, with its one warning, from the first request after
    such a restart.  (Every request failed, for ever: each registered the pool again, was refused
    -- SharedMemoryRefused -- and the next found the pool unregistered again.)"""
    data = floats(64)
    with tritonshm.Client(client_url(fresh_server, protocol)) as c:
        assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)
        with restarted_unable_to_open_our_memory(fresh_server):
            with pytest.warns(RuntimeWarning, match="falling back.*cannot open our shared memory"):
                out = c.infer("identity_fp32", {"INPUT0": data + 1})
            assert np.array_equal(out["OUTPUT0"], data + 1)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # one warning, not one per request
                assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data + 2})["OUTPUT0"], data + 2)


def test_a_stream_after_a_restart_unable_to_open_our_memory_goes_on_the_wire(fresh_server):
    """stream()'s request after such a restart goes on the wire (its registering again refused
    was the caller's error, and every stream request after it too)."""
    data = floats(64)
    with tritonshm.Client(fresh_server.grpc_url) as c:
        (out,) = list(c.stream("identity_fp32", {"INPUT0": data}))
        assert np.array_equal(out["OUTPUT0"], data)
        with restarted_unable_to_open_our_memory(fresh_server):
            for i in range(2):
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # (the one warning of falling back)
                    (out,) = list(c.stream("identity_fp32", {"INPUT0": data + i}))
                assert np.array_equal(out["OUTPUT0"], data + i)


def test_wire_transport_never_touches_shared_memory(server, protocol):
    with tritonshm.Client(client_url(server, protocol), transport="wire") as c:
        data = floats(64)
        assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)
        assert c.pools() == []
        with pytest.raises(tritonshm.Error, match="wire"):
            c.request("identity_fp32")


@pytest.fixture(scope="module")
def isolated_server():
    """A real server with a /dev/shm of its own: it cannot open our segments,
    exactly like a server on another machine or in another IPC namespace."""
    from tritonshm.server import LocalServer

    with start_or_skip(LocalServer(private_shm=True)) as srv:
        yield srv


def test_falls_back_to_the_wire_when_the_server_cannot_see_our_memory(isolated_server, protocol):
    url = client_url(isolated_server, protocol)
    data = floats(256)
    with tritonshm.Client(url) as c:
        with pytest.warns(RuntimeWarning, match="falling back.*cannot open our shared memory"):
            out = c.infer("identity_fp32", {"INPUT0": data})
        assert np.array_equal(out["OUTPUT0"], data)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # one warning, not one per request
            batch = floats(20, 4)
            assert np.array_equal(c.infer("batched_fp32", {"INPUT0": batch})["OUTPUT0"], batch * 2)
        assert c.pools() == []
    with tritonshm.Client(url, transport="shm") as strict:
        with pytest.raises(tritonshm.SharedMemoryRefused, match="--ipc=host"):
            strict.infer("identity_fp32", {"INPUT0": data})


def test_forgotten_client_is_cleaned_up_by_gc(server):
    c = tritonshm.Client(server.grpc_url)
    c.infer("identity_fp32", {"INPUT0": floats(8)})
    (extent,) = live_pool(c, "identity_fp32").extents
    key, name = extent.memory.region.key, extent.name
    del c, extent
    gc.collect()
    assert not os.path.exists("/dev/shm" + key)
    with tritonshm.Client(server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)


def test_forgotten_client_stops_its_threads(server):
    def tritonshm_threads():
        return {t for t in threading.enumerate() if t.name.startswith("tritonshm-")}

    before = tritonshm_threads()
    c = tritonshm.Client(server.grpc_url, slots=2)
    assert c.infer_async("identity_fp32", {"INPUT0": floats(4)}).result(timeout=30)
    c.infer("batched_fp32", {"INPUT0": floats(40, 4)})  # chunked: starts the chunk workers
    started = tritonshm_threads() - before
    assert len(started) == 4
    del c
    gc.collect()
    for thread in started:
        thread.join(timeout=10)
        assert not thread.is_alive(), thread.name


def test_close_returns_once_its_threads_are_gone(server):
    """An HTTP client's I/O threads close their tritonclient clients and gevent hubs as they end;
    close() returned before they had, and a program that exited right after close() could end
    in a SIGSEGV (greenlet's teardown of a daemon thread stopped mid-way by the interpreter's
    exit: ~40% of the runs of tritonclient's simple_http_async_infer_client.py through
    tritonshm.http, tests/examples/)."""
    before = {t for t in threading.enumerate() if t.name.startswith("tritonshm-")}
    c = tritonshm.Client(client_url(server, "http"), slots=2)
    assert c.infer_async("identity_fp32", {"INPUT0": floats(4)}).result(timeout=30)
    started = {t for t in threading.enumerate() if t.name.startswith("tritonshm-")} - before
    assert any(t.name.startswith("tritonshm-http") for t in started)
    c.close()
    assert [t.name for t in started if t.is_alive()] == []


def test_forgotten_client_is_cleaned_up_at_exit(server):
    script = textwrap.dedent(f"""
        import numpy as np, tritonshm
        c = tritonshm.Client({server.grpc_url!r})
        c.infer("identity_fp32", {{"INPUT0": np.ones(8, np.float32)}})
        ((name,),) = [pool.regions for pool in c.pools()]
        print("/" + name, name)  # registered under its key without the slash
    """)  # exits without close()
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    key, name = done.stdout.split()
    assert not os.path.exists("/dev/shm" + key)
    with tritonshm.Client(server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)


def test_a_forked_child_never_unregisters_the_parents_pool(server):
    with tritonshm.Client(server.grpc_url) as c:
        data = floats(16)
        c.infer("identity_fp32", {"INPUT0": data})
        (extent,) = live_pool(c, "identity_fp32").extents
        pid = os.fork()
        if pid == 0:  # the child drops its copy of the client at once
            try:
                run_finalizer(c)
            finally:
                os._exit(0)
        os.waitpid(pid, 0)
        assert extent.name in tritonshm.status(c.tritonclient)
        assert os.path.exists("/dev/shm" + extent.memory.region.key)
        assert np.array_equal(c.infer("identity_fp32", {"INPUT0": data})["OUTPUT0"], data)


_FORKED_CHILD_USES_THE_CLIENT = """
import gc, os, sys
import numpy as np, tritonshm
c = tritonshm.Client(sys.argv[1])
held = c.infer("batched_fp32", {"INPUT0": np.ones((2, 4), np.float32)}, copy=False)["OUTPUT0"]
pid = os.fork()
if pid == 0:
    try:
        del held  # (the child has no use for the parent's result)
        gc.collect()
        for i in range(4):
            c.infer("batched_fp32", {"INPUT0": np.full((2, 4), 100 + i, np.float32)}, copy=False)
        os._exit(4)  # served: from slots the parent's requests and results use
    except tritonshm.ClientClosed as exc:
        os._exit(3 if "fork()" in str(exc) else 5)
    except BaseException:
        os._exit(6)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status), float(held[0, 0]))
c.close()
"""


@pytest.mark.parametrize("protocol", ["grpc", "http"])
def test_a_forked_child_is_refused_the_parents_client(server, protocol):
    """The parent's slots are shared memory the child maps too, their bookkeeping a copy: a child
    that leased from it wrote the slot a result the parent kept is a view of (its 2.0 became the
    child's 103.0).  The child's copy is closed at the fork, saying so."""
    done = subprocess.run([sys.executable, "-c", _FORKED_CHILD_USES_THE_CLIENT, client_url(server, protocol)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    child, held = done.stdout.split()
    assert (int(child), float(held)) == (3, 2.0)


def test_close_asks_again_while_the_server_still_uses_host_memory(server, monkeypatch):
    """Triton answers before it releases a request's regions ("currently in use" for a moment):
    close() asks again instead of leaving our name registered on the server."""
    c = tritonshm.Client(server.grpc_url)
    c.infer("identity_fp32", {"INPUT0": np.ones(8, np.float32)})
    (name,) = c.pools()[0].regions
    refusals = refuse_unregister(monkeypatch, name, times=2)
    c.close()
    assert len(refusals) == 2
    with tritonshm.Client(server.grpc_url) as other:
        assert name not in tritonshm.status(other.tritonclient)


def test_alternating_shapes_on_one_slot_keep_their_bindings(server, protocol):
    """A slot's request objects are bound again for each new shape; a request message kept
    for an earlier shape (gRPC) must still say that shape's sizes when it comes back."""
    with tritonshm.Client(client_url(server, protocol), slots=1) as c:
        for step in range(12):
            x = np.arange(4 * (1 + step % 3), dtype=np.float32).reshape(2, -1) + step
            np.testing.assert_array_equal(c.infer("variable_fp32", {"INPUT0": x})["OUTPUT0"], x + 1)


def test_a_port_of_the_other_protocol_is_named_as_the_likely_mistake(server):
    """The HTTP port given as a gRPC address, the gRPC port as an http:// URL: each error says so
    and what to give instead; a port where nothing listens gets no such guess."""
    x = {"INPUT0": np.zeros(4, np.float32)}
    http = re.escape(server.http_url)
    cases = [(server.http_url, rf"is {http} the server's HTTP port\? .*for HTTP, give http://{http}$"),
             ("http://" + server.grpc_url, r"is it the server's gRPC port\? For gRPC, give the address as host:port, "
                                           r"without http://$")]
    for url, hint in cases:
        with tritonshm.Client(url) as c:
            with pytest.raises(tritonshm.ServerUnavailable, match=hint):
                c.infer("identity_fp32", x)
    for url in ("127.0.0.1:1", "http://127.0.0.1:1"):
        with tritonshm.Client(url) as c:
            with pytest.raises(tritonshm.ServerUnavailable) as refused:
                c.infer("identity_fp32", x)
            assert "port?" not in str(refused.value)


def test_an_unknown_model_lists_the_models_the_server_has(server, protocol):
    """A misspelt model name: UnknownModel (a ServerError, a LookupError), in the
    "<what>: <hint>. Server said: ..." form, naming the models the server does have."""
    import asyncio

    import tritonshm.aio

    url = client_url(server, protocol)
    with tritonshm.Client(url) as c:
        with pytest.raises(tritonshm.UnknownModel, match=r"no model 'batched_fp33'; it has .*'batched_fp32'.*"
                                                         r"Server said: .*unknown model") as caught:
            c.infer("batched_fp33", {"INPUT0": np.ones((1, 4), np.float32)})
    assert isinstance(caught.value, tritonshm.ServerError) and isinstance(caught.value, LookupError)
    assert caught.value.status() is not None

    async def main():
        async with tritonshm.aio.Client(url) as ac:
            await ac.model_info("identity_fp33")

    with pytest.raises(tritonshm.UnknownModel, match="'identity_fp32'"):
        asyncio.run(main())
