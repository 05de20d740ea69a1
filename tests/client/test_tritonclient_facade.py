"""tritonshm.grpc / tritonshm.http: a tritonclient script with its import line changed does what it
did, its tensors through the facade's slots.

Each test runs the same script with tritonclient's module and with the facade's against the one
session server and compares what came back (arrays, dtypes, shapes, ``get_output``,
``get_response``, errors and their ``status()``); the facade's calls are checked to have used its
slot pools, not the wire.
"""

from __future__ import annotations

import importlib
import inspect
import pickle

import ml_dtypes
import numpy as np
import pytest

import tritonshm
from tritonshm import _tritonclient_compat as compat
from tritonshm.errors import InferenceServerException

pytestmark = pytest.mark.server


def modules(protocol):
    """(tritonclient's module, the facade's) for *protocol*."""
    return importlib.import_module(f"tritonclient.{protocol}"), importlib.import_module(f"tritonshm.{protocol}")


def connect(module, server, protocol):
    """A client of *module*; a facade's sends even its smallest calls through the slots (these
    tests are about what the slots carry; gRPC's inline small calls have their own test)."""
    client = module.InferenceServerClient(server.grpc_url if protocol == "grpc" else server.http_url)
    if module.__name__.startswith("tritonshm"):
        client.tritonshm_inline_bytes = 0
    return client


def script(module, client, model, arrays, datatypes, outputs, **options):
    """What a tritonclient user writes: InferInputs with set_data_from_numpy, infer, as_numpy."""
    inputs = []
    for (name, array), datatype in zip(arrays.items(), datatypes):
        inp = module.InferInput(name, list(array.shape), datatype)
        inp.set_data_from_numpy(array)
        inputs.append(inp)
    requested = None if outputs is None else [module.InferRequestedOutput(name) for name in outputs]
    return client.infer(model, inputs, outputs=requested, **options)


def response_of(result):
    """The response as comparable data (gRPC: the protobuf message itself)."""
    return result.get_response()


CASES = {
    "identity_fp32": ({"INPUT0": np.arange(1000, dtype=np.float32)}, ["FP32"], ["OUTPUT0"]),
    "identity_bytes": ({"INPUT0": np.array([b"a", b"", "h\u00e9".encode(), b"\x00\xff" * 50], dtype=object)},
                       ["BYTES"], ["OUTPUT0"]),
    "identity_bf16": ({"INPUT0": np.array([1.5, -2.25, 3.0, 1e3], dtype=ml_dtypes.bfloat16)}, ["BF16"], ["OUTPUT0"]),
    "add_sub": ({"INPUT0": np.arange(16, dtype=np.float32), "INPUT1": np.full(16, 2, np.float32)},
                ["FP32", "FP32"], ["OUTPUT0", "OUTPUT1"]),
    "simple": ({"INPUT0": np.arange(32, dtype=np.int32).reshape(2, 16),
                "INPUT1": np.ones((2, 16), np.int32)}, ["INT32", "INT32"], ["OUTPUT1", "OUTPUT0"]),
}


@pytest.fixture
def both(server, protocol):
    """(tritonclient's module and client, the facade's module and client)."""
    plain_module, facade_module = modules(protocol)
    plain, facade = connect(plain_module, server, protocol), connect(facade_module, server, protocol)
    yield plain_module, plain, facade_module, facade
    plain.close()
    facade.close()


def slot_result(result, facade_module):
    """The facade answered through its slots: not tritonclient's own result of a wire call."""
    assert isinstance(result, facade_module.InferResult)
    return type(result) is not facade_module.InferResult


@pytest.mark.parametrize("model", sorted(CASES))
# outputs=[] is tritonclient's every output (it sends no list), as None is
@pytest.mark.parametrize("asked", ["named", None, []], ids=["outputs", "no-outputs", "empty-outputs"])
def test_the_same_script_gives_the_same_results(both, model, asked):
    plain_module, plain, facade_module, facade = both
    arrays, datatypes, outputs = CASES[model]
    outputs = outputs if asked == "named" else asked
    expected = script(plain_module, plain, model, arrays, datatypes, outputs)
    got = script(facade_module, facade, model, arrays, datatypes, outputs)
    assert slot_result(got, facade_module)
    assert facade.tritonshm.pools(), "the facade sent its tensors over the wire"
    for name in CASES[model][2]:
        want, have = expected.as_numpy(name), got.as_numpy(name)
        assert have.dtype == want.dtype and have.shape == want.shape
        assert have.tolist() == want.tolist()
        assert got.get_output(name) == expected.get_output(name)
    assert got.as_numpy("NO_SUCH_OUTPUT") is None and got.get_output("NO_SUCH_OUTPUT") is None
    assert response_of(got) == response_of(expected)


@pytest.mark.parametrize("model", sorted(CASES))
def test_a_result_pickles_as_tritonclients_does(both, protocol, model):
    plain_module, plain, facade_module, facade = both
    arrays, datatypes, outputs = CASES[model]
    expected = script(plain_module, plain, model, arrays, datatypes, outputs)
    if protocol == "http":
        expected = pickle.loads(pickle.dumps(expected))
    # (tritonclient.grpc's own does not pickle: its protobuf class names a module, grpc_service_pb2,
    # that does not import.  The slots' result does, as the HTTP one.)
    got = script(facade_module, facade, model, arrays, datatypes, outputs)
    assert slot_result(got, facade_module)
    got.get_response()  # the response built: it is not what travels
    again = pickle.loads(pickle.dumps(got))
    assert type(again) is type(got)
    for name in outputs:
        want, have = expected.as_numpy(name), again.as_numpy(name)
        assert have.dtype == want.dtype and have.shape == want.shape and have.tolist() == want.tolist()
        assert again.get_output(name) == expected.get_output(name)
    assert response_of(again) == response_of(expected)
    # Its data is its own: the slot's next request leaves it as it was.
    kept = {name: again.as_numpy(name).copy() for name in outputs}
    script(facade_module, facade, model, {n: a[::-1].copy() for n, a in arrays.items()}, datatypes, outputs)
    for name in outputs:
        assert again.as_numpy(name).tolist() == kept[name].tolist()


def test_inputs_are_left_as_they_were(both):
    _, _, facade_module, facade = both
    x = np.arange(8, dtype=np.float32)
    inp = facade_module.InferInput("INPUT0", [8], "FP32")
    inp.set_data_from_numpy(x)
    before = (inp.name(), inp.datatype(), inp.shape())
    result = facade.infer("identity_fp32", [inp])
    assert (inp.name(), inp.datatype(), inp.shape()) == before
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    x[:] = -1  # the call copied it: the result is not a view of the caller's array
    assert result.as_numpy("OUTPUT0")[0] == 0
    again = facade.infer("identity_fp32", [inp])  # the same objects, sent once more
    # The one difference from tritonclient (said in the README): the InferInput keeps the array,
    # read at the call, where tritonclient would have kept a copy of its bytes made at set time.
    np.testing.assert_array_equal(again.as_numpy("OUTPUT0"), x)


def test_set_data_from_numpy_keeps_the_array_and_the_wire_gets_tritonclients_bytes(both, protocol):
    """Kept, not serialised: the one copy is the call's.  A call that goes on the wire (here: a
    request_id) sends the bytes tritonclient would have; mistakes are tritonclient's own."""
    plain_module, plain, facade_module, facade = both
    x = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]  # not contiguous: tritonclient's tobytes() is C order
    inp = facade_module.InferInput("INPUT0", [3, 2], "FP32")
    assert inp.set_data_from_numpy(x) is inp and inp.kept_array() is x
    expected = plain_module.InferInput("INPUT0", [3, 2], "FP32").set_data_from_numpy(x)
    http = protocol == "http"
    assert compat.input_content(inp, http) == compat.input_content(expected, http)
    assert compat.tensor_of(inp) == compat.tensor_of(expected)
    wire = facade.infer("variable_fp32", [inp], request_id="on-the-wire")
    assert type(wire) is facade_module.InferResult  # tritonclient's own call
    np.testing.assert_array_equal(wire.as_numpy("OUTPUT0"), x + 1)  # variable_fp32 adds one
    inp.set_shared_memory("someone_elses", 24)
    assert inp.kept_array() is None and \
        compat.tensor_of(inp) == compat.tensor_of(expected.set_shared_memory("someone_elses", 24))
    for bad in (x.astype(np.float64), x.reshape(2, 3), [1.0, 2.0]):
        errors = []
        for made in (facade_module.InferInput("INPUT0", [3, 2], "FP32"), plain_module.InferInput("INPUT0", [3, 2], "FP32")):
            with pytest.raises(InferenceServerException) as caught:
                made.set_data_from_numpy(bad)
            errors.append(caught.value.message())
        assert errors[0] == errors[1]


def test_an_input_bound_by_hand_passes_through(both, protocol):
    _, _, facade_module, facade = both
    x = np.arange(64, dtype=np.float32)
    with tritonshm.SystemRegion.create(1 << 16) as region:
        name = tritonshm.register(facade, region)
        try:
            region.write(x)
            inp = facade_module.InferInput("INPUT0", [64], "FP32")
            tritonshm.bind_input(inp, region)
            result = facade.infer("identity_fp32", [inp], outputs=[facade_module.InferRequestedOutput("OUTPUT0")])
        finally:
            tritonshm.unregister(facade, name)
    assert not slot_result(result, facade_module)  # tritonclient's own call
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)


@pytest.mark.parametrize("mistake", ["name", "dtype", "batch"])
def test_a_mistake_gets_tritonclients_error(both, mistake):
    plain_module, plain, facade_module, facade = both
    model, arrays, datatypes = "identity_fp32", {"INPUT0": np.zeros(4, np.float32)}, ["FP32"]
    if mistake == "name":
        arrays = {"NOT_AN_INPUT": arrays["INPUT0"]}
    elif mistake == "dtype":
        arrays, datatypes = {"INPUT0": np.zeros(4, np.int32)}, ["INT32"]
    else:  # beyond max_batch_size 8: the server's error, not a silent split
        model, arrays, datatypes = "simple", {"INPUT0": np.zeros((9, 16), np.int32),
                                              "INPUT1": np.zeros((9, 16), np.int32)}, ["INT32", "INT32"]
    errors = []
    for module, client in ((plain_module, plain), (facade_module, facade)):
        with pytest.raises(InferenceServerException) as caught:
            script(module, client, model, arrays, datatypes, None)
        errors.append((caught.value.status(), caught.value.message()))
    assert errors[1] == errors[0]


def test_sequence_options_go_with_the_request(both):
    plain_module, plain, facade_module, facade = both
    sums = []
    for module, client, sequence_id in ((plain_module, plain, 4101), (facade_module, facade, 4102)):
        seen = []
        for step, value in enumerate([1.0, 2.0, 4.0]):
            result = script(module, client, "accumulate_fp32", {"INPUT0": np.full((1, 3), value, np.float32)},
                            ["FP32"], ["OUTPUT0"], sequence_id=sequence_id, sequence_start=step == 0,
                            sequence_end=step == 2)
            seen.append(result.as_numpy("OUTPUT0").tolist())
        sums.append(seen)
    assert sums[1] == sums[0] and sums[0][-1] == [[7.0, 7.0, 7.0]]
    assert facade.tritonshm.pools()


def test_unregister_everything_then_infer_registers_the_slots_again(both):
    _, _, facade_module, facade = both
    x = np.arange(16, dtype=np.float32)
    arrays = {"INPUT0": x}
    first = script(facade_module, facade, "identity_fp32", arrays, ["FP32"], None)
    assert slot_result(first, facade_module)
    facade.unregister_system_shared_memory()  # every region on the server, as tritonclient's
    assert tritonshm.status(facade) == {}
    result = script(facade_module, facade, "identity_fp32", arrays, ["FP32"], None)
    assert slot_result(result, facade_module)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x)
    names = set(tritonshm.status(facade))
    assert names and names == {n for pool in facade.tritonshm.pools() for n in pool.regions}


def test_close_releases_the_slots(server, protocol):
    _, facade_module = modules(protocol)
    with connect(facade_module, server, protocol) as facade:
        script(facade_module, facade, "identity_fp32", {"INPUT0": np.ones(4, np.float32)}, ["FP32"], None)
        names = {n for pool in facade.tritonshm.pools() for n in pool.regions}
        assert names <= set(tritonshm.status(facade))
    assert facade.tritonshm is None
    with connect(facade_module, server, protocol) as other:
        assert not names & set(tritonshm.status(other))


def test_small_grpc_calls_go_inline_as_tritonclient_sends_them(server):
    """Below tritonshm_inline_bytes (gRPC: faster there, measured) a call is tritonclient's own,
    its tensors in the message; from it up, through the slots; 0 sends every call through them."""
    import tritonshm.grpc as grpcclient

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.tritonshm_inline_bytes == 128 << 10
        small = np.arange(1024, dtype=np.float32)
        result = script(grpcclient, client, "identity_fp32", {"INPUT0": small}, ["FP32"], None)
        assert type(result) is grpcclient.InferResult and client.tritonshm is None  # inline
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), small)
        large = np.arange(32 << 10, dtype=np.float32)  # 128 KiB
        result = script(grpcclient, client, "identity_fp32", {"INPUT0": large}, ["FP32"], None)
        assert slot_result(result, grpcclient)
        client.tritonshm_inline_bytes = 0
        result = script(grpcclient, client, "identity_fp32", {"INPUT0": small}, ["FP32"], None)
        assert slot_result(result, grpcclient)
    import tritonshm.http as httpclient

    assert httpclient.InferenceServerClient.tritonshm_inline_bytes == 0  # HTTP: the slots win at every size


def assert_input_class_is_tritonclients_extended(ours, theirs):
    """The facades' InferInput: tritonclient's, subclassed, every public method's signature its own."""
    assert issubclass(ours, theirs) and ours is not theirs
    assert inspect.signature(ours) == inspect.signature(theirs)
    for name in dir(theirs):
        if not name.startswith("_"):
            assert inspect.signature(getattr(ours, name)) .parameters.keys() == \
                inspect.signature(getattr(theirs, name)).parameters.keys(), name


def test_the_facade_exports_every_public_name_of_tritonclients_module(protocol):
    plain_module, facade_module = modules(protocol)
    public = [name for name in dir(plain_module) if not name.startswith("_")]
    for name in public:
        if name not in ("InferenceServerClient", "InferInput", "aio"):  # aio: in dir() once imported; ours is ours
            assert getattr(facade_module, name) is getattr(plain_module, name), name
    assert facade_module.__all__ == plain_module.__all__
    assert_input_class_is_tritonclients_extended(facade_module.InferInput, plain_module.InferInput)
    client_class = facade_module.InferenceServerClient
    assert issubclass(client_class, plain_module.InferenceServerClient)
    assert inspect.signature(client_class) == inspect.signature(plain_module.InferenceServerClient)

    def shape(function):
        return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]

    assert shape(client_class.infer) == shape(plain_module.InferenceServerClient.infer)


@pytest.fixture(scope="module")
def isolated_server():
    """A real server with a /dev/shm of its own: it cannot open our segments, as a server on
    another machine or in a container without the host's /dev/shm."""
    from tritonshm.server import LocalServer
    from triton_fixtures import start_or_skip

    with start_or_skip(LocalServer(private_shm=True)) as srv:
        yield srv


def test_a_server_that_cannot_see_our_memory_gets_the_request_on_the_wire_with_one_warning(isolated_server,
                                                                                          protocol):
    import warnings

    plain_module, facade_module = modules(protocol)
    x = np.arange(64 << 10, dtype=np.float32)  # above gRPC's inline size: the slots would carry it
    arrays = {"INPUT0": x}
    with connect(plain_module, isolated_server, protocol) as plain, \
            connect(facade_module, isolated_server, protocol) as facade:
        expected = script(plain_module, plain, "identity_fp32", arrays, ["FP32"], ["OUTPUT0"])
        with pytest.warns(RuntimeWarning, match="cannot open our shared memory"):
            got = script(facade_module, facade, "identity_fp32", arrays, ["FP32"], ["OUTPUT0"])
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # one warning, not one per call
            again = script(facade_module, facade, "identity_fp32", arrays, ["FP32"], ["OUTPUT0"])
        for result in (got, again):
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected.as_numpy("OUTPUT0"))
            assert result.get_output("OUTPUT0") == expected.get_output("OUTPUT0")
        assert facade.tritonshm.pools() == []  # nothing left registered where it cannot be seen
        if protocol == "grpc":  # the stream too: its requests on the wire, its answers tritonclient's
            heard = []
            facade.start_stream(lambda result, error: heard.append((result, error)))
            for count in (2, 0):
                inputs = [facade_module.InferInput("INPUT0", [4], "FP32").set_data_from_numpy(np.ones(4, np.float32)),
                          facade_module.InferInput("COUNT", [1], "INT32").set_data_from_numpy(
                              np.array([count], np.int32))]
                facade.async_stream_infer("stream_fp32", inputs, request_id=str(count))
            facade.stop_stream()
            assert [(r.get_response().id, e) for r, e in heard] == [("2", None), ("2", None)]
