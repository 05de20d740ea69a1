"""tritonshm.grpc / tritonshm.http against tritonclient where they differed last (issue 39): a client
dropped with requests pending, a stream after "unregister everything", ``verbose=True``, and the
text of an error.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server (or a server of its own) and compares what the caller sees; the facade's calls are
checked to have gone through its slots.
"""

from __future__ import annotations

import gc
import importlib
import re
import threading

import numpy as np
import pytest

from tritonshm.errors import InferenceServerException

pytestmark = pytest.mark.server


def modules(protocol):
    """(tritonclient's module, the facade's) for *protocol*."""
    return importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")


def connect(module, server, protocol, **kwargs):
    """A client of *module*; a facade's sends even its smallest calls through the slots."""
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url, **kwargs)
    if module.__name__.startswith("tritonshm"):
        client.tritonshm_inline_bytes = 0
    return client


def inputs_of(module, array, name="INPUT0", datatype="FP32"):
    inp = module.InferInput(name, list(array.shape), datatype)
    inp.set_data_from_numpy(array)
    return [inp]


# -- 1. a client dropped with async_infer calls pending -------------------------------------------


def pools_while_running(held):
    """Whether *held* (a facade's tritonshm client; None: a plain tritonclient) had slot pools
    while its requests to slow_fp32 ran (500 ms each) -- looked at then: once the last one ends,
    a dropped client closes at once, its pools with it."""
    for _ in range(40):
        if held is None or held.pools():
            return held is not None
        threading.Event().wait(0.01)
    return False


def dropped_with_pending(module, server, protocol, count):
    """async_infer *count* requests to slow_fp32 (500 ms each), drop the client at once, then
    wait for what they answer: results or errors, in order; and whether it had slot pools while
    they ran."""
    client = connect(module, server, protocol)
    arrays = [np.full(4, i, np.float32) for i in range(count)]
    if protocol == "grpc":
        answers, left = [None] * count, threading.Semaphore(0)

        def callback(index, result, error):
            answers[index] = error if error is not None else result.as_numpy("OUTPUT0")
            left.release()

        for i, x in enumerate(arrays):
            client.async_infer("slow_fp32", inputs_of(module, x),
                               lambda result, error, i=i: callback(i, result, error))
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        pooled = pools_while_running(held)
        del client
        gc.collect()
        for _ in arrays:
            assert left.acquire(timeout=30), "a callback was never called"
    else:
        pending = [client.async_infer("slow_fp32", inputs_of(module, x)) for x in arrays]
        slots = getattr(client, "_tritonshm_slots", None)
        held = getattr(client, "tritonshm", None)
        pooled = pools_while_running(held)
        del client
        gc.collect()
        answers = []
        for request in pending:
            try:
                answers.append(request.get_result(timeout=30).as_numpy("OUTPUT0"))
            except InferenceServerException as error:
                answers.append(error)
    return answers, slots, held, pooled


def test_a_dropped_client_finishes_its_pending_async_infer_as_tritonclients(server, protocol):
    plain_module, facade_module = modules(protocol)
    expected, *_ = dropped_with_pending(plain_module, server, protocol, 3)
    got, slots, held, pooled = dropped_with_pending(facade_module, server, protocol, 3)
    assert [a.tolist() for a in expected] == [[float(i)] * 4 for i in range(3)]
    assert [a if isinstance(a, Exception) else a.tolist() for a in got] == [a.tolist() for a in expected]
    assert pooled, "the facade sent its tensors over the wire"
    # Once they are done, the dropped client goes, and its slots with it (closed on the thread
    # that let go of it last: waited for here, so that the next test finds nothing of it).
    del got
    for _ in range(200):
        gc.collect()
        if slots.client is None and not held.pools():
            break
        threading.Event().wait(0.05)
    assert slots.client is None and not held.pools(), "the dropped client's slots were never released"


# -- 2. a stream after unregister_system_shared_memory() of everything ---------------------------


def stream_request(module, count, value=1.0):
    """stream_fp32's inputs: *count* responses, OUTPUT0 = INPUT0 + i."""
    return [module.InferInput("INPUT0", [3], "FP32").set_data_from_numpy(np.full(3, value, np.float32)),
            module.InferInput("COUNT", [1], "INT32").set_data_from_numpy(np.array([count], np.int32))]


def heard(result, error):
    """What a stream's callback heard, comparable across modules."""
    if error is not None:
        return ("error", error.status(), error.message())
    response = result.get_response()
    return ("result", response.id, result.as_numpy("OUTPUT0").tolist())


def unregister_everything(client):
    """``unregister_system_shared_memory()`` of every region, asked again while the server still
    uses one (a request's final response may come before it let go of the request's region)."""
    for _ in range(100):
        try:
            return client.unregister_system_shared_memory()
        except InferenceServerException as error:
            if "Failed to unregister" not in error.message():
                raise
            threading.Event().wait(0.05)
    raise AssertionError("the server never let go of a region")


async def unregister_everything_aio(client):
    """:func:`unregister_everything` of an aio client."""
    import asyncio

    for _ in range(100):
        try:
            return await client.unregister_system_shared_memory()
        except InferenceServerException as error:
            if "Failed to unregister" not in error.message():
                raise
            await asyncio.sleep(0.05)
    raise AssertionError("the server never let go of a region")


def stream_after_unregister_all(module, server):
    """A stream's request answered, then unregister_system_shared_memory() (every region), then
    more requests on the same stream: what the callback heard, and the facade's pools."""
    answers, first = [], threading.Event()
    client = module.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: (answers.append(heard(result, error)), first.set()))
        client.async_stream_infer("stream_fp32", stream_request(module, 1, 0.0), request_id="before")
        assert first.wait(30)
        unregister_everything(client)
        for i in range(3):
            client.async_stream_infer("stream_fp32", stream_request(module, 2, float(i + 1)), request_id=f"after{i}")
        client.stop_stream()
        held = getattr(client, "tritonshm", None)
        return sorted(answers), None if held is None else held.pools()
    finally:
        client.close()


def test_a_stream_goes_on_after_unregister_everything_as_tritonclients(server):
    plain_module, facade_module = modules("grpc")
    expected, _ = stream_after_unregister_all(plain_module, server)
    got, pools = stream_after_unregister_all(facade_module, server)
    assert len(expected) == 7 and all(kind == "result" for kind, *_ in expected)
    assert got == expected
    assert pools and all(pool.running == 0 and pool.held == 0 for pool in pools), \
        "the facade sent the stream's inputs over the wire, or kept a slot"


def unregister_everything_while_a_request_runs(module, server, protocol):
    """A region of the caller's own registered, a request to slow_fp32 on its way (async_infer),
    then unregister_system_shared_memory() with no name: what it raised (None), the regions left
    but the facade's slots, and the request's answer."""
    import tritonshm

    client = connect(module, server, protocol)
    region = tritonshm.SystemRegion.create(4096)
    try:
        client.register_system_shared_memory("callers_own", region.key, 4096)
        pending = client.async_infer("slow_fp32", inputs_of(module, np.full(4, 3.0, np.float32)),
                                     **({"callback": lambda result, error: None} if protocol == "grpc" else {}))
        threading.Event().wait(0.2)  # (on the server now: its slot in use until it answers at 0.5 s)
        slots = {name for pool in client.tritonshm.pools() for name in pool.regions} \
            if module.__name__.startswith("tritonshm") else set()
        try:
            client.unregister_system_shared_memory()
            raised = None
        except InferenceServerException as error:
            raised = str(error)
        left = set(tritonshm.status(client)) - slots
        answer = float(pending.get_result().as_numpy("OUTPUT0")[0]) if protocol == "http" else None
        threading.Event().wait(0.5)  # (grpc: the callback's request answered)
        return raised, left, answer
    finally:
        client.close()
        region.close()


def test_unregister_everything_while_a_request_runs_as_tritonclients(server, protocol):
    """tritonclient's unregisters every region at once; the server refused the facade's for its
    slot a running request uses (it unregistered the rest), and the facade raised that."""
    plain_module, facade_module = modules(protocol)
    expected = unregister_everything_while_a_request_runs(plain_module, server, protocol)
    assert expected[:2] == (None, set())
    assert unregister_everything_while_a_request_runs(facade_module, server, protocol) == expected


def test_an_aio_unregister_everything_while_a_request_runs_as_tritonclients(server, protocol):
    import asyncio

    import tritonshm

    async def run(module):
        client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
        client.tritonshm_inline_bytes = 0
        region = tritonshm.SystemRegion.create(4096)
        try:
            await client.register_system_shared_memory("callers_own", region.key, 4096)
            pending = asyncio.ensure_future(client.infer("slow_fp32", inputs_of(module, np.full(4, 3.0, np.float32))))
            await asyncio.sleep(0.2)  # (on the server now: its slot in use until it answers at 0.5 s)
            slots = {name for pool in client.tritonshm.pools() for name in pool.regions}
            try:
                await client.unregister_system_shared_memory()
                raised = None
            except InferenceServerException as error:
                raised = str(error)
            left = set(await tritonshm.status(client)) - slots
            return raised, left, float((await pending).as_numpy("OUTPUT0")[0])
        finally:
            await client.close()
            region.close()

    facade_module = importlib.import_module(f"tritonshm.{protocol}.aio")
    assert asyncio.run(run(facade_module)) == (None, set(), 3.0)


def test_an_aio_stream_goes_on_after_unregister_everything_as_tritonclients(server):
    import asyncio

    async def run(module):
        client = module.InferenceServerClient(server.grpc_url)
        try:
            first = asyncio.Event()

            async def requests():
                yield {"model_name": "stream_fp32", "inputs": stream_request(module, 1, 0.0), "request_id": "before"}
                await first.wait()
                await unregister_everything_aio(client)
                for i in range(3):
                    yield {"model_name": "stream_fp32", "inputs": stream_request(module, 2, float(i + 1)),
                           "request_id": f"after{i}"}

            answers = []
            async for result, error in client.stream_infer(requests()):
                answers.append(heard(result, error))
                first.set()
            held = getattr(client, "tritonshm", None)
            return sorted(answers), None if held is None else held.pools()
        finally:
            await client.close()

    import tritonclient.grpc.aio
    import tritonshm.grpc.aio

    expected, _ = asyncio.run(run(tritonclient.grpc.aio))
    got, pools = asyncio.run(run(tritonshm.grpc.aio))
    assert len(expected) == 7 and all(kind == "result" for kind, *_ in expected)
    assert got == expected
    assert pools and all(pool.running == 0 and pool.held == 0 for pool in pools)


# -- 4. the text of an error -------------------------------------------------------------------


def error_seen(error, like=None):
    """What a caller reads of an error: its text, and tritonclient's accessors where it has them
    (where tritonclient's error, *like*, has none -- tritonclient.http's network timeout is the
    builtin TimeoutError -- a facade's may add them: not compared)."""
    message = getattr(like if like is not None else error, "message", None)
    status = getattr(like if like is not None else error, "status", None)
    return {"str": str(error), "message": error.message() if callable(message) else None,
            "status": error.status() if callable(status) else None}


def failing_call(module, client, protocol, case, way):
    """One call that fails (*case*: the server refuses it, or it times out), made *way*: the
    error, as the caller gets it."""
    if case == "refused":  # a sequence's first request without its START flag: the server's 400
        model, x, options = "accumulate_fp32", np.ones((1, 3), np.float32), {"sequence_id": 4391}
    else:  # slow_fp32 answers after 500 ms
        model, x, options = "slow_fp32", np.ones(4, np.float32), {"client_timeout": 0.1} if protocol == "grpc" else {}
    inputs = inputs_of(module, x)
    try:
        if way == "infer":
            client.infer(model, inputs, **options)
        elif protocol == "grpc":
            heard = []
            done = threading.Event()
            client.async_infer(model, inputs, lambda result, error: (heard.append(error), done.set()), **options)
            assert done.wait(30)
            return heard[0]
        else:
            client.async_infer(model, inputs, **options).get_result(timeout=30)
    except Exception as error:
        return error
    raise AssertionError("the call did not fail")


@pytest.mark.parametrize("way", ["infer", "async_infer"])
@pytest.mark.parametrize("case", ["refused", "timeout"])
def test_an_error_reads_as_tritonclients(server, protocol, case, way):
    errors = []
    # HTTP's timeout is the client's network_timeout (tritonclient.http's infer takes no client_timeout)
    kwargs = {"network_timeout": 0.2} if protocol == "http" and case == "timeout" else {}
    for module in modules(protocol):
        client = connect(module, server, protocol, **kwargs)
        try:
            errors.append(failing_call(module, client, protocol, case, way))
            if module.__name__.startswith("tritonshm"):
                assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
        finally:
            threading.Event().wait(0.6)  # slow_fp32 done with it: the next client's request waits for none
            client.close()
    expected, got = errors
    assert error_seen(got, like=expected) == error_seen(expected)
    # (the same branch of `except InferenceServerException: ... except TimeoutError: ...`)
    assert isinstance(got, InferenceServerException) == isinstance(expected, InferenceServerException)
    if isinstance(expected, TimeoutError):  # tritonclient.http's: gevent's socket timeout
        assert isinstance(got, TimeoutError) and got.args == expected.args and str(expected) == "timed out"
    elif case == "refused":
        assert str(expected) == f"[{expected.status()}] {expected.message()}"
    else:
        assert expected.message() == "Deadline Exceeded"


@pytest.mark.parametrize("case", ["refused", "timeout"])
def test_an_aio_error_reads_as_tritonclients(server, protocol, case):
    import asyncio

    # HTTP's timeout is the client's conn_timeout (tritonclient.http.aio's infer takes no client_timeout)
    kwargs = {"conn_timeout": 0.2} if protocol == "http" and case == "timeout" else {}

    async def run(module):
        client = connect(module, server, protocol, **kwargs)
        try:
            if case == "refused":
                await client.infer("accumulate_fp32", inputs_of(module, np.ones((1, 3), np.float32)),
                                   sequence_id=4392)
            else:
                await client.infer("slow_fp32", inputs_of(module, np.ones(4, np.float32)),
                                   **({"client_timeout": 0.1} if protocol == "grpc" else {}))
        except Exception as error:
            if module.__name__.startswith("tritonshm"):
                assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
            return error
        finally:
            await asyncio.sleep(0.6)  # slow_fp32 done with it
            await client.close()
        raise AssertionError("the call did not fail")

    expected = asyncio.run(run(importlib.import_module(f"tritonclient.{protocol}.aio")))
    got = asyncio.run(run(importlib.import_module(f"tritonshm.{protocol}.aio")))
    assert error_seen(got, like=expected) == error_seen(expected)
    assert isinstance(got, InferenceServerException) == isinstance(expected, InferenceServerException)
    if isinstance(expected, TimeoutError):  # tritonclient.http.aio's: aiohttp's
        assert isinstance(got, TimeoutError) and got.args == expected.args
    elif case == "refused":
        assert str(expected) == f"[{expected.status()}] {expected.message()}"
    else:
        assert expected.message() == "Deadline Exceeded"


# -- 3. verbose=True ---------------------------------------------------------------------------

_REGION = re.compile(r"tritonshm-\d+-[0-9a-f]+")
_NUMBER_AFTER = re.compile(r"((?:shared_memory_offset|shared_memory_byte_size|Content-Length)(?:int64|\D)*?)\d+")


def printed(text):
    """What a verbose call printed, its region names and offsets, sizes and lengths masked (the
    facade's slots are named and laid out its own way), and tritonclient.http's "Sent request"
    last: it prints it after a 10 ms pause, before or after the response as the server is quick."""
    lines = _NUMBER_AFTER.sub(r"\1N", _REGION.sub("REGION", text)).splitlines()
    return [line for line in lines if line != "Sent request"] + ["Sent request"] * lines.count("Sent request")


def verbose_call(module, client, protocol, way, x, bound=None):
    """identity_fp32 on *x*, made *way*; *bound*: (region, its name) to bind the tensors to by
    hand (tritonclient's shared-memory call, the facade's slots' counterpart)."""
    inp = module.InferInput("INPUT0", list(x.shape), "FP32")
    out = module.InferRequestedOutput("OUTPUT0")
    if bound is None:
        inp.set_data_from_numpy(x)
    else:
        import tritonshm

        region, name = bound
        region.write(x)
        tritonshm.bind_input(inp, region, 0, x.nbytes, name=name)
        tritonshm.bind_output(out, region, 4096, x.nbytes, name=name)
    if way == "infer":
        return client.infer("identity_fp32", [inp], outputs=[out])
    if protocol == "http":
        return client.async_infer("identity_fp32", [inp], outputs=[out]).get_result(timeout=30)
    done = threading.Event()
    heard = []
    client.async_infer("identity_fp32", [inp], lambda result, error: (heard.append(result), done.set()),
                       outputs=[out])
    assert done.wait(30)
    return heard[0]


@pytest.mark.parametrize("way", ["infer", "async_infer"])
def test_verbose_prints_the_request_and_response_as_tritonclient(server, protocol, way, capsys):
    import tritonshm

    plain_module, facade_module = modules(protocol)
    x = np.arange(4, dtype=np.float32)
    plain = connect(plain_module, server, protocol)
    try:
        with tritonshm.SystemRegion.create(1 << 16) as region:
            name = tritonshm.register(plain, region)
            try:
                plain._verbose = True  # (after registering: only the call's own prints)
                capsys.readouterr()
                verbose_call(plain_module, plain, protocol, way, x, bound=(region, name))
                expected = capsys.readouterr().out
                plain._verbose = False
            finally:
                tritonshm.unregister(plain, name)
    finally:
        plain.close()
    with connect(facade_module, server, protocol, verbose=True) as facade:
        capsys.readouterr()
        first = verbose_call(facade_module, facade, protocol, way, x)
        got = capsys.readouterr().out
        again = verbose_call(facade_module, facade, protocol, way, x)  # the slots made: the same again
        got_again = capsys.readouterr().out
        assert type(first) is not facade_module.InferResult, "the facade sent its tensors over the wire"
        np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), x)
    assert "shared_memory_region" in expected
    assert printed(got) == printed(expected)
    assert printed(got_again) == printed(expected)
    # The version the server ran, as the response said it (no metadata call of the facade's own)
    response = first.get_response()
    assert (response["model_version"] if protocol == "http" else response.model_version) == "1"


def test_verbose_aio_infer_prints_the_request_and_response_as_tritonclient(server, protocol, capsys):
    import asyncio

    import tritonshm

    x = np.arange(4, dtype=np.float32)

    async def run(module, bound=None):
        # (the facade verbose from the start: it prints nothing but its calls)
        client = connect(module, server, protocol, **({} if bound is not None else {"verbose": True}))
        try:
            if bound is not None:
                region = bound
                name = await tritonshm.register(client, region)
                bound = (region, name)
                client._verbose = True  # (after registering: only the call's own prints)
            capsys.readouterr()
            inp = module.InferInput("INPUT0", [4], "FP32")
            out = module.InferRequestedOutput("OUTPUT0")
            if bound is None:
                inp.set_data_from_numpy(x)
            else:
                region.write(x)
                tritonshm.bind_input(inp, region, 0, x.nbytes, name=name)
                tritonshm.bind_output(out, region, 4096, x.nbytes, name=name)
            result = await client.infer("identity_fp32", [inp], outputs=[out])
            said = capsys.readouterr().out
            client._verbose = False
            if bound is not None:
                await tritonshm.unregister(client, name)
            else:
                assert type(result) is not module.InferResult, "the facade sent its tensors over the wire"
            return said
        finally:
            await client.close()

    with tritonshm.SystemRegion.create(1 << 16) as region:
        expected = asyncio.run(run(importlib.import_module(f"tritonclient.{protocol}.aio"), region))
    got = asyncio.run(run(importlib.import_module(f"tritonshm.{protocol}.aio")))
    assert "shared_memory_region" in expected
    # (aiohttp asks for a gzip answer unless told not to; the slots' answer is not compressed)
    assert printed(got) == printed(expected.replace("'Content-Encoding': 'gzip', ", ""))


def without_tensors(text):
    """A stream's verbose text without what differs by design: the inputs' shared-memory
    parameters (the facade's) and their bytes in the message (tritonclient's), region names."""
    text = re.sub(r'  parameters \{\n    key: "shared_memory_\w+"\n    value \{\n      \w+: [^\n]+\n    \}\n  \}\n',
                  "", text)
    return re.sub(r"raw_input_contents: [^\n]+\n", "", text)


def test_a_verbose_stream_prints_as_tritonclients(server, capsys):
    import tritonclient.grpc
    import tritonshm.grpc

    said = []
    for module in (tritonclient.grpc, tritonshm.grpc):
        client = module.InferenceServerClient(server.grpc_url, verbose=True)
        try:
            answered = threading.Semaphore(0)
            capsys.readouterr()
            client.start_stream(lambda result, error: answered.release())
            # one at a time: each request's prints and its responses' in one order
            for request_id, count, empty, answers in (("two", 2, False, 2), ("one", 1, True, 2), ("refused", -1, False, 1)):
                client.async_stream_infer("stream_fp32", stream_request(module, count), request_id=request_id,
                                          enable_empty_final_response=empty)
                for _ in range(answers):
                    assert answered.acquire(timeout=30)
            client.stop_stream()
            said.append(capsys.readouterr().out)
            if module is tritonshm.grpc:
                assert client.tritonshm.pools(), "the facade sent the stream's inputs over the wire"
        finally:
            client.close()
    expected, got = said
    assert "raw_input_contents" in expected and "shared_memory_region" in got
    assert without_tensors(got) == without_tensors(expected)


# -- a plugin's headers ----------------------------------------------------------------------


def test_a_plugins_headers_go_with_the_calls_the_slots_carry(server, protocol, capsys):
    """tritonclient asks a registered plugin for each call's headers; the facade asks it once per
    call it carries through the slots too, and sends what it added (shown by verbose) -- and for
    the calls its slots make on their own (registrations, model reads: first calls only)."""
    class Plugin:
        def __init__(self):
            self.calls = 0

        def __call__(self, request):
            self.calls += 1
            request.headers["x-tshm-plugin"] = "yes"

    seen = []
    for module in modules(protocol):
        client = connect(module, server, protocol, verbose=True)
        plugin = Plugin()
        client.register_plugin(plugin)
        try:
            capsys.readouterr()
            for _ in range(2):
                result = client.infer("identity_fp32", inputs_of(module, np.arange(4, dtype=np.float32)))
            sent = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("infer,", "POST"))]
            seen.append((plugin.calls, len(sent), all("x-tshm-plugin" in line for line in sent)))
            if module.__name__.startswith("tritonshm"):
                assert type(result) is not module.InferResult, "the facade sent its tensors over the wire"
        finally:
            client.close()
    assert seen[0] == (2, 2, True)  # tritonclient's
    calls, sent, carried = seen[1]
    assert (sent, carried) == (2, True) and calls > 2  # (the slots' own first calls asked it too)


# -- 6. what `except` sees of an error, and JSON data the server refuses ---------------------------


def described(error):
    """What ``except`` clauses see of *error* (its text, and the builtin bases it has)."""
    return str(error), isinstance(error, TimeoutError), isinstance(error, OSError), isinstance(error, LookupError)


@pytest.mark.parametrize("way", ["infer", "async_infer"])
def test_a_grpc_deadline_is_no_builtin_timeout_as_tritonclients(server, way):
    """tritonclient's DEADLINE_EXCEEDED is an InferenceServerException and nothing else: ``except
    TimeoutError`` placed before ``except InferenceServerException`` (a retry on ``(ConnectionError,
    TimeoutError)``) does not take it.  The facade's was also tritonshm's ServerTimeout, a TimeoutError."""
    seen = []
    for module in modules("grpc"):
        client = connect(module, server, "grpc")
        try:
            given = inputs_of(module, np.ones(4, np.float32))
            if way == "infer":
                with pytest.raises(InferenceServerException) as raised:
                    client.infer("slow_fp32", given, client_timeout=0.1)
                seen.append(described(raised.value))
            else:
                heard, done = [], threading.Event()
                client.async_infer("slow_fp32", given, lambda result, error: (heard.append(described(error)),
                                                                              done.set()), client_timeout=0.1)
                assert done.wait(30)
                seen.extend(heard)
            if module.__name__.startswith("tritonshm"):
                assert client.tritonshm.pools(), "the facade sent its tensors over the wire"
        finally:
            threading.Event().wait(0.6)  # (slow_fp32 done with it before the next client's request)
            client.close()
    assert seen[0] == ("[StatusCode.DEADLINE_EXCEEDED] Deadline Exceeded", False, False, False)
    assert seen[1] == seen[0]


def test_fp16_data_given_as_json_is_refused_by_the_server_as_with_tritonclient(server):
    """HTTP ``set_data_from_numpy(x, binary_data=False)`` of FP16: the server refuses JSON FP16 data
    (``[400] receiving FP16 data via JSON is not supported``); the facade's slots took it."""
    seen = []
    for module in modules("http"):
        client = connect(module, server, "http")
        try:
            given = module.InferInput("INPUT0", [2], "FP16")
            given.set_data_from_numpy(np.array([1.5, 2.0], np.float16), binary_data=False)
            with pytest.raises(InferenceServerException) as raised:
                client.infer("identity_fp16", [given])
            seen.append(str(raised.value))
        finally:
            client.close()
    assert "FP16 data via JSON is not supported" in seen[0]
    assert seen[1] == seen[0]
