"""What goes on the wire for a request, and what is read back.

A slot's request objects (tritonclient's ``InferInput`` and
``InferRequestedOutput``, bound to its offsets) and its ready messages
(gRPC's ``ModelInferRequest``, HTTP's prepared request), made once and kept
on its extent; the messages of the plain gRPC/HTTP path; and the outputs
read out of a slot or a reply, copied or viewed, on the host or a GPU.  Functions of their arguments: no engine
state, no I/O.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _http1
from ..errors import ShapeMismatch
from . import _bytes, _devices, _intake
from ._devices import DeviceTensor, Placement
from ._model import ModelInfo
from ._pool import Lease
from ._steps import Send

__all__ = ["collect", "http_request", "make_room", "output_shape", "own_request", "rows_for", "slot_request", "wire_request",
           "wire_results"]

_MESSAGES_PER_SLOT = 16  # what a slot keeps per input shapes and outputs (messages, quick views)


def make_room(cache: dict[Any, Any]) -> None:
    """A slot's cache keeps what it made per input shapes (tuple keys) for a few shapes only:
    with many, it starts over (the per-name request objects stay)."""
    made = [key for key in cache if isinstance(key, tuple)]
    if len(made) >= _MESSAGES_PER_SLOT:
        for key in made:
            del cache[key]


def collect(info: ModelInfo, lease: Lease | None, result: Any, names: Sequence[str],
            copy: bool, results: Placement, rows: _intake.Rows | None = None,
            stream: Any = None, lent: Any = None,
            allocated: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], bool]:
    """The outputs of *result*, read from the slot: views that hold it where
    ``copy=False`` and the slot is where the results are wanted, else copies
    (numpy on the host, or device arrays made by the results' library);
    outputs with *rows* go there (and are left out of the dict); results the
    caller *allocated* (``out=``) are those objects, written by the server where
    *lent*, else copied in.  Copies touching a GPU are queued on *stream*;
    also returns whether any was."""
    if lease is None:  # everything lent: the server wrote each result where the caller wanted it
        assert allocated is not None and lent and all(n in lent.outputs for n in names), \
            "a result not lent has room in a slot"
        for name in names:
            _intake.check_answer_fits_out(info, name, output_shape(result, name), allocated[name])
        return {name: allocated[name].obj for name in names}, False
    memory, layout = lease.extent.memory, lease.pool.layout
    on_gpu = stream is not None and (memory.kind == "cuda" or results.device is not None)
    outputs, queued = {}, False
    if rows is not None and rows.ready is not None:
        stream.wait(rows.ready)  # the batch's results were allocated on the caller's stream
    for name in names:
        spec = info.output(name)
        shape = output_shape(result, name)
        into = rows_for(info, rows, name, shape)
        given = None if allocated is None else allocated.get(name)
        if given is not None:
            _intake.check_answer_fits_out(info, name, shape, given)
            if not (lent and name in lent.outputs):  # not lent: copied in from the slot
                memory.read_into(given.tensor.source, lease.offset(name), given.tensor.nbytes,
                                 given.tensor.offset, stream)
                queued |= on_gpu
            outputs[name] = given.obj
        elif into is not None:
            memory.read_into(into[0], lease.offset(name), into[2], into[1], stream)
            queued |= on_gpu
        elif spec.is_bytes:
            raw = memory.bytes_at(lease.offset(name), layout.capacities[name])
            outputs[name] = _bytes.decode(raw, math.prod(shape), shape)
            del raw
        elif not copy and memory.device == results.device:
            outputs[name] = memory.view(lease.handle, layout.offsets[name], spec.dtype, shape)
        elif results.device is None:
            outputs[name] = memory.copy_out(lease.offset(name), spec.dtype, shape, stream)
            queued |= on_gpu
        else:
            out = outputs[name] = _devices.empty(results, spec.dtype, shape)
            memory.read_into(out, lease.offset(name), math.prod(shape) * spec.dtype.itemsize, 0, stream)
            queued |= on_gpu
    return outputs, queued


def output_shape(result: Any, name: str) -> tuple[int, ...]:
    """The shape the server gave output *name* in *result* (gRPC: a protobuf tensor; HTTP: JSON)."""
    tensor = result.get_output(name)
    return tuple(map(int, tensor["shape"] if isinstance(tensor, dict) else tensor.shape))


def http_request(send: Send) -> _http1.Prepared:
    """The HTTP request of a :class:`Send` that carries no message made ready ahead (it has
    options, BYTES sizes of its own, or its tensors in the message)."""
    if send.options is None:
        return _http1.prepare(send.model, send.version, send.inputs, send.outputs)
    return _http1.prepare(send.model, send.version, send.inputs, send.outputs, send.options.http_infer_kwargs(),
                          send.options.idempotent)


def rows_for(info: ModelInfo, rows: _intake.Rows | None, name: str,
             shape: tuple[int, ...]) -> tuple[Any, int, int] | None:
    """``(array, byte offset, nbytes)`` where output *name* of this chunk goes, or None."""
    if rows is None or name not in rows.arrays:
        return None
    spec = info.output(name)
    if shape != (rows.count,) + spec.dims:
        raise ShapeMismatch(f"model {info.name!r} returned output {name!r} of shape {list(shape)} "
                            f"for a chunk of {rows.count}; its config says {[rows.count, *spec.dims]}")
    row_bytes = math.prod(spec.dims) * spec.dtype.itemsize
    return rows.arrays[name], rows.start * row_bytes, rows.count * row_bytes


def slot_request(wire: Any, info: ModelInfo, lease: Lease | None, shapes: Mapping[str, tuple[int, ...]],
                 names: Sequence[str], bytes_sizes: Mapping[str, int],
                 prepare: bool = False, lent: Any = None) -> tuple[list, list, Any]:
    """InferInputs and InferRequestedOutputs naming the slot's offsets, and with *prepare*
    (no per-request options) the whole request message, ready to send (or None).

    They are made once per slot and reused: an input is bound again only
    when its shape or size changed; an output's binding never changes; a
    message is made once per slot, input shapes and outputs asked
    for -- a copy of what the objects said then, so it stays right when
    they are bound again for other shapes -- and tritonclient's request
    building is skipped on every later call (over HTTP, tritonclient
    itself too: see :mod:`tritonshm._http1`).

    Tensors *lent* (a request's :class:`~._claim.Claim`: the caller's own GPU
    memory, registered) are named where they are, in request objects of their
    own (the slot's stay bound to the slot); a message is kept for them too,
    keyed by where they were.  No *lease*: every tensor is lent (nothing is kept).
    """
    if lease is None:
        return _lent_request(wire, info, shapes, names, lent)
    memory, layout = lease.extent.memory, lease.pool.layout
    cache = lease.extent.requests.get(lease.index)
    if cache is None:
        cache = lease.extent.requests[lease.index] = {}
    # The message, when it can be kept, is keyed by what it holds (the inputs' bindings
    # are a function of the slot and their shapes -- or of where lent tensors are; BYTES
    # sizes vary with the strings).
    message_key = ("message", tuple(shapes.items()), tuple(names)) if prepare and not bytes_sizes else None
    if lent and message_key is not None:
        message_key += tuple((kind, key, where.name, where.offset)
                             for kind, table in (("in", lent.inputs), ("out", lent.outputs))
                             for key, where in table.items())
    name = lease.extent.name
    assert name is not None  # a leased slot's extent is registered
    inputs = []
    for spec in info.inputs:
        shape = list(shapes[spec.name])
        where = lent.inputs.get(spec.name) if lent else None
        if where is not None:
            infer_input = wire.infer_input(spec.name, shape, spec.datatype)
            where.extent.memory.bind_input(infer_input, where.name, where.offset, where.nbytes)
            inputs.append(infer_input)
            continue
        nbytes = bytes_sizes[spec.name] if spec.is_bytes else math.prod(shape) * spec.dtype.itemsize
        if nbytes == 0:
            # Triton refuses a shared-memory binding of 0 bytes: an empty
            # tensor travels in the message (it costs nothing there).
            empty = wire.infer_input(spec.name, shape, spec.datatype)
            empty.set_data_from_numpy(np.empty(shape, spec.dtype))
            inputs.append(empty)
            message_key = None  # its data travels in the message: nothing to keep
            continue
        cached = cache.get(spec.name)
        if cached is None or cached[1] != shape or cached[2] != nbytes:
            infer_input = cached[0] if cached is not None else wire.infer_input(spec.name, shape, spec.datatype)
            infer_input.set_shape(shape)
            memory.bind_input(infer_input, name, lease.offset(spec.name), nbytes)
            cache[spec.name] = cached = (infer_input, shape, nbytes)
        inputs.append(cached[0])
    requested = []
    for output in names:
        where = lent.outputs.get(output) if lent else None
        if where is not None:
            requested_output = wire.requested_output(output)
            where.extent.memory.bind_output(requested_output, where.name, where.offset, where.nbytes)
            requested.append(requested_output)
            continue
        key = "out:" + output
        requested_output = cache.get(key)
        if requested_output is None:
            requested_output = cache[key] = wire.requested_output(output)
            memory.bind_output(requested_output, name, lease.offset(output),
                               layout.capacities[output])
        requested.append(requested_output)
    if message_key is None:
        return inputs, requested, None
    message = cache.get(message_key)
    if message is None:
        make_room(cache)
        message = cache[message_key] = wire.request_message(info.name, info.version, inputs, requested)
    return inputs, requested, message


def own_request(wire: Any, info: ModelInfo, lease: Lease, shapes: Mapping[str, tuple[int, ...]],
                names: Sequence[str]) -> tuple[list, list, Any]:
    """Request objects of the slot's own for these input shapes and outputs -- bound once and
    never again, unlike :func:`slot_request`'s, so the quick path keeps them with their message
    -- and the message (None where a tensor travels in it: an empty input).  No BYTES inputs."""
    memory, name = lease.extent.memory, lease.extent.name
    inputs, in_message = [], False
    for spec in info.inputs:
        shape = list(shapes[spec.name])
        infer_input = wire.infer_input(spec.name, shape, spec.datatype)
        nbytes = math.prod(shape) * spec.dtype.itemsize
        if nbytes:
            memory.bind_input(infer_input, name, lease.offset(spec.name), nbytes)
        else:  # Triton refuses a 0-byte binding: an empty tensor travels in the message
            infer_input.set_data_from_numpy(np.empty(shape, spec.dtype))
            in_message = True
        inputs.append(infer_input)
    requested = []
    for output in names:
        requested_output = wire.requested_output(output)
        memory.bind_output(requested_output, name, lease.offset(output), lease.pool.layout.capacities[output])
        requested.append(requested_output)
    message = None if in_message else wire.request_message(info.name, info.version, inputs, requested)
    return inputs, requested, message


def _lent_request(wire: Any, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]], names: Sequence[str],
                  lent: Any) -> tuple[list, list, Any]:
    """The request objects of a request whose every tensor is lent: each named where it is."""
    inputs = []
    for spec in info.inputs:
        where = lent.inputs[spec.name]
        infer_input = wire.infer_input(spec.name, list(shapes[spec.name]), spec.datatype)
        where.extent.memory.bind_input(infer_input, where.name, where.offset, where.nbytes)
        inputs.append(infer_input)
    requested = []
    for output in names:
        where = lent.outputs[output]
        requested_output = wire.requested_output(output)
        where.extent.memory.bind_output(requested_output, where.name, where.offset, where.nbytes)
        requested.append(requested_output)
    return inputs, requested, None


def wire_request(wire: Any, info: ModelInfo, arrays: Mapping[str, np.ndarray],
                 names: list[str]) -> tuple[list, list]:
    """Inputs and outputs for the plain gRPC/HTTP path: tensors inside the messages."""
    inputs = []
    for spec in info.inputs:
        array = arrays[spec.name]
        if spec.is_bytes:
            array = np.asarray(array, dtype=np.object_)
        elif isinstance(array, DeviceTensor):
            array = _devices.to_host(array)
        infer_input = wire.infer_input(spec.name, list(array.shape), spec.datatype)
        infer_input.set_data_from_numpy(array)
        inputs.append(infer_input)
    return inputs, [wire.requested_output(n) for n in names]


def wire_results(info: ModelInfo, result: Any, names: Sequence[str], results: Placement,
                 rows: _intake.Rows | None = None) -> dict[str, Any]:
    """The outputs of a plain gRPC/HTTP reply, moved to the GPU where *results*
    says; outputs with *rows* go there (and are left out of the dict)."""
    outputs = {}
    if rows is not None and rows.ready is not None:
        _devices.copy_stream(results.device).wait(rows.ready)
    for name in names:
        array = result.as_numpy(name)
        into = rows_for(info, rows, name, array.shape)
        if into is not None and results.device is None:
            assert rows is not None  # rows_for() found room in them
            np.copyto(into[0][rows.start:rows.start + rows.count], array)
        elif into is not None:
            _devices.copy_bytes(into[0], np.ascontiguousarray(array), into[2], into[1])
        elif results.device is None or array.dtype.hasobject:
            outputs[name] = array
        else:
            outputs[name] = _devices.to_device(array, results)
    return outputs
