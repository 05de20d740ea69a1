"""What goes on the wire for a request.

A slot's request objects (tritonclient's ``InferInput`` and
``InferRequestedOutput``, bound to its offsets) and its ready messages
(gRPC's ``ModelInferRequest``, HTTP's prepared request), made once and kept
on its extent; and the messages of the plain gRPC/HTTP path.  Functions of
their arguments: no engine state, no I/O (what comes back is
:mod:`._results`').
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from .. import _http1
from . import _devices
from ._devices import DeviceTensor
from ._model import ModelInfo, TensorSpec
from ._pool import Lease
from ._steps import Send

__all__ = ["http_request", "make_room", "own_request", "slot_request", "wire_request"]

_MESSAGES_PER_SLOT = 16  # what a slot keeps per input shapes and outputs (messages, quick views)
_LENT_MESSAGES = 64  # the ready messages of all-lent requests a client keeps (then it starts over)


def make_room(cache: dict[Any, Any]) -> None:
    """A slot's cache keeps what it made per input shapes (tuple keys) for a few shapes only:
    with many, it starts over (the per-name request objects stay)."""
    made = [key for key in cache if isinstance(key, tuple)]
    if len(made) >= _MESSAGES_PER_SLOT:
        for key in made:
            del cache[key]


def http_request(send: Send) -> _http1.Prepared:
    """The HTTP request of a :class:`Send` that carries no message made ready ahead (it has
    options, BYTES sizes of its own, or its tensors in the message)."""
    if send.options is None:
        return _http1.prepare(send.model, send.version, send.inputs, send.outputs)
    return _http1.prepare(send.model, send.version, send.inputs, send.outputs, send.options.http_infer_kwargs(),
                          send.options.idempotent)


def slot_request(wire: Any, info: ModelInfo, lease: Lease | None, shapes: Mapping[str, tuple[int, ...]],
                 names: Sequence[str], bytes_sizes: Mapping[str, int],
                 prepare: bool = False, lent: Any = None,
                 kept: dict[tuple, Any] | None = None) -> tuple[list, list, Any]:
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
    own (the slot's stay bound to the slot), made once per place they are lent
    from and kept on the slot, as is a message for them.  No *lease*: every
    tensor is lent, and what is made is kept in *kept* (the client's, keyed by
    model first) instead of on a slot.
    """
    if lease is None:
        if not prepare or kept is None:
            return _lent_request(wire, info, shapes, names, lent)
        kept_key = (info.name, info.version, tuple(shapes.items()), tuple(names), _lent_places(lent))
        made = kept.get(kept_key)
        if made is None:
            if len(kept) >= _LENT_MESSAGES:
                kept.clear()
            inputs, requested, _ = _lent_request(wire, info, shapes, names, lent)
            message = wire.request_message(info.name, info.version, inputs, requested)
            made = kept[kept_key] = (inputs, requested, message)
        return made
    memory, layout = lease.extent.memory, lease.pool.layout
    cache = lease.extent.requests.get(lease.index)
    if cache is None:
        cache = lease.extent.requests[lease.index] = {}
    # The message, when it can be kept, is keyed by what it holds (the inputs' bindings
    # are a function of the slot and their shapes -- or of where lent tensors are; BYTES
    # sizes vary with the strings).
    message_key = ("message", tuple(shapes.items()), tuple(names)) if prepare and not bytes_sizes else None
    if lent and message_key is not None:
        message_key += _lent_places(lent)
    name = lease.extent.name
    assert name is not None  # a leased slot's extent is registered
    inputs = []
    for spec in info.inputs:
        shape = list(shapes[spec.name])
        where = lent.inputs.get(spec.name) if lent else None
        if where is not None:  # (made once per place it is lent from: nothing binds it again)
            lent_key = ("lent", spec.name, tuple(shape), where.name, where.offset, where.nbytes)
            infer_input = cache.get(lent_key)
            if infer_input is None:
                make_room(cache)
                infer_input = cache[lent_key] = _lent_input(wire, spec, shape, where)
            inputs.append(infer_input)
            continue
        nbytes = bytes_sizes[spec.name] if spec.is_bytes else math.prod(shape) * spec.dtype.itemsize
        if nbytes == 0:
            inputs.append(_empty_input(wire, spec, shape))
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
            out_key = ("lent out", output, where.name, where.offset, where.nbytes)
            requested_output = cache.get(out_key)
            if requested_output is None:
                make_room(cache)
                requested_output = cache[out_key] = _lent_output(wire, output, where)
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
        nbytes = math.prod(shape) * spec.dtype.itemsize
        if nbytes == 0:
            inputs.append(_empty_input(wire, spec, shape))
            in_message = True
            continue
        infer_input = wire.infer_input(spec.name, shape, spec.datatype)
        memory.bind_input(infer_input, name, lease.offset(spec.name), nbytes)
        inputs.append(infer_input)
    requested = []
    for output in names:
        requested_output = wire.requested_output(output)
        memory.bind_output(requested_output, name, lease.offset(output), lease.pool.layout.capacities[output])
        requested.append(requested_output)
    message = None if in_message else wire.request_message(info.name, info.version, inputs, requested)
    return inputs, requested, message


def _empty_input(wire: Any, spec: TensorSpec, shape: list[int]) -> Any:
    """An input of 0 bytes: Triton refuses a shared-memory binding of 0 bytes, so the empty
    tensor travels in the message (it costs nothing there)."""
    empty = wire.infer_input(spec.name, shape, spec.datatype)
    empty.set_data_from_numpy(np.empty(shape, spec.dtype))
    return empty


def _lent_request(wire: Any, info: ModelInfo, shapes: Mapping[str, tuple[int, ...]], names: Sequence[str],
                  lent: Any) -> tuple[list, list, Any]:
    """The request objects of a request whose every tensor is lent: each named where it is."""
    inputs = [_lent_input(wire, spec, list(shapes[spec.name]), lent.inputs[spec.name]) for spec in info.inputs]
    requested = [_lent_output(wire, output, lent.outputs[output]) for output in names]
    return inputs, requested, None


def _lent_input(wire: Any, spec: TensorSpec, shape: list[int], where: Any) -> Any:
    """An InferInput naming a lent tensor where it is (*where*: its :class:`~._lent.Lent`)."""
    infer_input = wire.infer_input(spec.name, shape, spec.datatype)
    where.extent.memory.bind_input(infer_input, where.name, where.offset, where.nbytes)
    return infer_input


def _lent_output(wire: Any, output: str, where: Any) -> Any:
    """An InferRequestedOutput naming a lent ``out=`` tensor where it is."""
    requested_output = wire.requested_output(output)
    where.extent.memory.bind_output(requested_output, where.name, where.offset, where.nbytes)
    return requested_output


def _lent_places(lent: Any) -> tuple:
    """Where a request's lent tensors are (registration names and offsets), for the keys of
    what is kept for it."""
    places: list[tuple] = []  # (loops, not comprehensions: every warm lent request makes this key)
    for key, where in lent.inputs.items():
        places.append(("in", key, where.name, where.offset))
    for key, where in lent.outputs.items():
        places.append(("out", key, where.name, where.offset))
    return tuple(places)


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


