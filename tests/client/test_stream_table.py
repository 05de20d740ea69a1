"""The stream's sans-I/O core: which request each response belongs to, and when one is over."""

from __future__ import annotations

import queue

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

import tritonshm
from tritonshm.client._stream import StreamTable, request_message


def response(request_id, *, final=None, error="", output=None):
    message = service_pb2.ModelStreamInferResponse(error_message=error)
    message.infer_response.id = request_id
    message.infer_response.model_name = "m"
    if final is not None:
        message.infer_response.parameters["triton_final_response"].bool_param = final
    if output is not None:
        message.infer_response.outputs.add(name="OUTPUT0", datatype="FP32", shape=[len(output)])
        message.infer_response.raw_output_contents.append(np.asarray(output, np.float32).tobytes())
    return message


def wrap(infer_response):
    from tritonclient.grpc import InferResult

    return InferResult(infer_response)


def opened(table):
    inbox = queue.SimpleQueue()
    return table.open(inbox, inbox.put), inbox


def test_responses_go_to_their_request_until_the_final_one():
    table = StreamTable()
    (a, inbox_a), (b, inbox_b) = opened(table), opened(table)
    assert a.id != b.id
    ended = []
    a.when_final(lambda answered: ended.append(("a", answered)))
    table.dispatch(response(b.id, final=False, output=[2.0]), wrap)
    table.dispatch(response(a.id, final=False, output=[1.0]), wrap)
    table.dispatch(response(a.id, final=True), wrap)    # an empty final response
    first, last = inbox_a.get_nowait(), inbox_a.get_nowait()
    np.testing.assert_array_equal(first.result.as_numpy("OUTPUT0"), [1.0])
    assert not first.final and last.final and last.result is None and last.error is None
    assert ended == [("a", True)] and a.final and not b.final  # the server answered it to the end
    assert inbox_b.get_nowait().result.as_numpy("OUTPUT0")[0] == 2.0
    table.dispatch(response(a.id, final=True), wrap)    # an id no longer open: dropped
    assert inbox_a.empty()


def test_a_request_the_server_never_started_ends_with_its_error():
    """Triton answers one that failed to start with its id, the error and no parameters."""
    table = StreamTable()
    entry, inbox = opened(table)
    table.dispatch(response(entry.id, error="[request id: x] unexpected inference input 'X'"), wrap)
    got = inbox.get_nowait()
    assert got.final and isinstance(got.error, tritonshm.ServerError) and "unexpected" in str(got.error)
    assert entry.final


def test_an_error_mid_stream_is_not_the_end_unless_it_says_so():
    table = StreamTable()
    entry, inbox = opened(table)
    table.dispatch(response(entry.id, final=False, error="NaN in INPUT0"), wrap)
    assert not inbox.get_nowait().final and not entry.final
    table.dispatch(response(entry.id, final=True), wrap)
    assert inbox.get_nowait().final and entry.final


def test_a_region_the_server_forgot_is_region_not_registered():
    table = StreamTable()
    entry, inbox = opened(table)
    table.dispatch(response(entry.id, error="Unable to find system shared memory region: 'r'"), wrap)
    assert isinstance(inbox.get_nowait().error, tritonshm.RegionNotRegistered)


def test_a_broken_stream_ends_every_open_request_and_refuses_new_ones():
    table = StreamTable()
    (a, inbox_a), (b, inbox_b) = opened(table), opened(table)
    ended = []
    b.when_final(lambda answered: ended.append(("b", answered)))
    gone = tritonshm.ServerUnavailable("gone")
    table.fail_all(gone)
    errors = [inbox_a.get_nowait().error, inbox_b.get_nowait().error]
    # each request its own copy: one object raised by both would gather both callers' frames
    assert all(type(e) is type(gone) and str(e) == str(gone) for e in errors)
    assert errors[0] is not errors[1] and gone not in errors
    # not answered: the server may still be running them (their claims hold what they name)
    assert ended == [("b", False)] and a.final and b.final
    later = []
    a.when_final(lambda answered: later.append(("now", answered)))  # already over: runs at once
    assert later == [("now", False)]
    with pytest.raises(tritonshm.ServerUnavailable):
        opened(table)


def test_the_request_message_asks_for_an_empty_final_response_and_carries_the_options():
    options = tritonshm.RequestOptions(parameters={"k": 1}, priority=1, sequence_id="s", sequence_start=True)
    message = request_message("m", "2", [], [], "id-1", options)
    assert message.model_name == "m" and message.model_version == "2" and message.id == "id-1"
    assert message.parameters["triton_enable_empty_final_response"].bool_param
    assert message.parameters["k"].int64_param == 1 and message.parameters["priority"].uint64_param == 1
    assert message.parameters["sequence_id"].string_param == "s"
    assert message.parameters["sequence_start"].bool_param
