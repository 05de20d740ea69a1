"""What comes back for a request: its outputs, read out of a slot or a reply, copied or viewed,
on the host or a GPU; the rows of a chunked batch's results and their joining; the results
the caller allocated (``out=``).  Functions of their arguments: no engine state, no I/O
(what goes out is :mod:`._messages`').
"""

from __future__ import annotations

import math
from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from ..errors import ModelChanged, OutputTooSmall, ShapeMismatch
from . import _bytes, _devices
from ._devices import HOST, Placement
from ._model import ModelInfo
from ._pool import Lease

__all__ = ["Rows", "answered_shape", "answered_shapes", "check_answer_fits_out", "check_version", "collect",
           "into_out", "join_chunks", "out_too_small", "result_rows", "rows_for", "wire_results"]


def check_answer_fits_out(info: ModelInfo, name: str, shape: tuple[int, ...], given: _devices.OutTensor) -> None:
    """The server's shape of output *name* is the shape of the tensor the caller allocated for it."""
    if tuple(shape) != given.tensor.shape:
        nbytes = math.prod(shape) * given.tensor.dtype.itemsize
        raise ShapeMismatch(f"model {info.name!r} returned output {name!r} of shape {list(shape)} ({nbytes} bytes), "
                            f"but out[{name!r}] has shape {list(given.tensor.shape)} ({given.tensor.nbytes} bytes)")


def out_too_small(info: ModelInfo, exc: OutputTooSmall, given: _devices.OutTensor) -> ShapeMismatch:
    """The error of an ``out=`` tensor too small for what the server made of output ``exc.output``
    (the server said so, before writing anything): no larger slot can help, so no second run."""
    needed = f"{exc.needed} bytes" if exc.needed is not None else "more bytes"
    return ShapeMismatch(f"model {info.name!r} made output {exc.output!r} of {needed}, but out[{exc.output!r}] "
                         f"holds {given.tensor.nbytes} bytes (shape {list(given.tensor.shape)}): give a tensor "
                         f"of the output's shape (the model ran once; nothing was written)")


def into_out(info: ModelInfo, outputs: dict[str, Any],
             out: Mapping[str, _devices.OutTensor] | None) -> dict[str, Any]:
    """*outputs* of the plain gRPC/HTTP path copied into the results the caller allocated."""
    for name, given in (out or {}).items():
        made = outputs[name]
        check_answer_fits_out(info, name, made.shape, given)
        _devices.copy_bytes(given.tensor.source, made, given.tensor.nbytes, dst_offset=given.tensor.offset)
        outputs[name] = given.obj
    return outputs


class Rows(NamedTuple):
    """Where one chunk's fixed-size outputs go: rows ``start : start + count`` of
    the whole batch's result arrays (*arrays*: output name -> array); *ready*: for
    device arrays of a caching allocator, the event their copies wait for first."""

    arrays: Mapping[str, Any]
    start: int
    count: int  # type: ignore[assignment]  # the field shadows tuple.count(), which nothing here calls
    ready: Any = None


def result_rows(info: ModelInfo, names: Sequence[str], chunks: Sequence[Mapping[str, Any]],
                placement: Placement = HOST) -> list[Rows | None]:
    """The whole batch's result arrays, made before the chunks run, and each chunk's rows of them.

    Outputs of fixed size are copied out of each chunk's slot straight into
    their rows, instead of into arrays of their own that are then joined (a
    second copy of every output).  Others (variable dims, BYTES) are joined.
    """
    fixed = [name for name in names if info.output(name).fixed]
    if not fixed or not info.batched:
        return [None] * len(chunks)
    counts = [next(iter(chunk.values())).shape[0] for chunk in chunks]
    batch = sum(counts)
    arrays = {}
    for name in fixed:
        spec = info.output(name)
        shape = (batch,) + spec.dims
        arrays[name] = np.empty(shape, spec.dtype) if placement.device is None \
            else _devices.empty(placement, spec.dtype, shape)
    # A caching allocator (torch, cupy) hands out memory safe on the allocating thread's current
    # stream only.  A copy into a result on the same thread is ordered after that stream by its
    # own DLPack handshake; these are copied into on workers, whose current stream is another:
    # their copies wait for this event of the caller's stream first.
    ready = None
    if placement.device is not None and placement.library != "tritonshm":
        ready = _devices.current_stream_event(placement.device)
    starts = np.cumsum([0] + counts[:-1]).tolist()
    return [Rows(arrays, start, count, ready) for start, count in zip(starts, counts)]


def join_chunks(parts: Sequence[Mapping[str, Any]], names: Sequence[str],
                placement: Placement = HOST, rows: Rows | None = None) -> dict[str, Any]:
    """The outputs of a chunked batch, reassembled in order (on the GPU where *placement*
    says); outputs the chunks wrote into *rows* are its arrays."""
    joined = {}
    for name in names:
        if rows is not None and name in rows.arrays:
            joined[name] = rows.arrays[name]
            continue
        pieces = [part[name] for part in parts]
        on_host = placement.device is None or isinstance(pieces[0], np.ndarray)  # BYTES stay on the host
        joined[name] = np.concatenate(pieces) if on_host else _devices.concatenate(pieces, placement)
    return joined


def collect(info: ModelInfo, lease: Lease | None, result: Any, names: Sequence[str],
            copy: bool, results: Placement, rows: Rows | None = None,
            stream: Any = None, lent: Any = None,
            allocated: Mapping[str, Any] | None = None,
            blocks: _devices.ResultBlocks | None = None,
            order: int | None = None, ready: Any = None) -> tuple[dict[str, Any], bool, Any]:
    """The outputs of *result*, read from the slot: views that hold it where
    ``copy=False`` and the slot is where the results are wanted, else copies
    (numpy on the host, or device arrays made by the results' library; ours
    from the client's cached *blocks*);
    outputs with *rows* go there (and are left out of the dict); results the
    caller *allocated* (``out=``) are those objects, written by the server where
    *lent*, else copied in.  Copies touching a GPU are queued on *stream*.

    Returns ``(outputs, queued, pending)``: *queued* -- copies were queued that the CPU must
    wait for before the outputs are handed out (host results, a chunked batch's rows, device
    results of another library when the caller's stream *order* is unknown); else *pending*
    (a :class:`~tritonshm.cuda.Pending`, or None) marks the device copies queued -- on the
    caller's stream *order* (a handle) where it is known, so that its next work is after them --
    the last of them records its event, our own result arrays carry it (their readers order
    after it), and the slot and result blocks they read and write are not reused before it
    completes -- no CPU wait.  *ready*: the request made ready
    that *result* answers, if it was one (:func:`answered_shapes`)."""
    shapes = answered_shapes(info, result, names, ready)
    if lease is None:  # everything lent: the server wrote each result where the caller wanted it
        assert allocated is not None and lent, "a result not lent has room in a slot"
        written = {}
        for name, shape in zip(names, shapes):
            assert name in lent.outputs, "a result not lent has room in a slot"
            given = allocated[name]
            check_answer_fits_out(info, name, shape, given)
            written[name] = given.obj
        return written, False, None
    memory, layout = lease.extent.memory, lease.pool.layout
    on_gpu = stream is not None and (memory.kind == "cuda" or results.device is not None)
    outputs, queued = {}, False
    # Device copies, queued last of all: (dst, offset, nbytes, dst_offset, ours)
    device_copies: list[tuple[Any, int, int, int, bool]] = []
    pending = None  # (made with the first device copy: a request with none asks for no event)
    carried = on_gpu and rows is None  # device copies may be carried, not waited for
    if rows is not None and rows.ready is not None:
        stream.wait(rows.ready)  # the batch's results were allocated on the caller's stream
    for name, shape in zip(names, shapes):
        spec = info.output(name)
        into = None if rows is None else rows_for(info, rows, name, shape)
        given = None if allocated is None else allocated.get(name)
        if given is not None:
            check_answer_fits_out(info, name, shape, given)
            if not (lent and name in lent.outputs):  # not lent: copied in from the slot
                if on_gpu:
                    device_copies.append((given.tensor.source, lease.offset(name), given.tensor.nbytes,
                                          given.tensor.offset, False))
                else:
                    memory.read_into(given.tensor.source, lease.offset(name), given.tensor.nbytes,
                                     given.tensor.offset, stream)
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
            if carried and pending is None:
                pending = _devices.Pending(_devices.ordering_event(stream.device))
            out = outputs[name] = _devices.empty(results, spec.dtype, shape, blocks, pending)
            device_copies.append((out, lease.offset(name), math.prod(shape) * spec.dtype.itemsize, 0,
                                  results.library == "tritonshm" and hasattr(out, "_after")))
    if not device_copies:
        return outputs, queued, None
    if carried and pending is None:  # (copies into out= tensors only)
        pending = _devices.Pending(_devices.ordering_event(stream.device))
    foreign = any(not ours for *_, ours in device_copies)
    if pending is None or queued or (foreign and order is None):
        # The CPU waits for everything anyway (or must: another library's result, or out=, on a
        # stream we do not know): the copies are queued plainly.
        for dst, offset, nbytes, dst_offset, _ in device_copies:
            memory.read_into(dst, offset, nbytes, dst_offset, stream)
        if pending is not None:  # (blocks were told of it: the CPU wait before they are handed out covers it)
            pending.completed()
        return outputs, True, None
    last = max((i for i, c in enumerate(device_copies) if c[2]), default=None)
    if last is None:  # nothing but empty tensors: nothing queued
        return outputs, queued, None
    # On the caller's stream where it is known and of the copy's device: what the caller queues
    # there next is after the copies with no wait to queue, and the results its library allocated
    # there need no handshake (torch's would order our copy stream after its stream with an event
    # of its own, in Python).  Else on our copy stream, the caller's stream (of another GPU than
    # the slot's) made to wait for it; our own arrays carry the event.
    on, then = stream, order
    if order is not None and results.device == stream.device:
        on, then = _devices.Stream.borrow(order, stream.device), None
    for i, (dst, offset, nbytes, dst_offset, ours) in enumerate(device_copies):
        if i == last:
            memory.read_into(dst, offset, nbytes, dst_offset, on, done=pending.event, then=then)
        else:
            memory.read_into(dst, offset, nbytes, dst_offset, on)
        if ours:
            dst._after(pending)
    if order is not None:
        _devices.stream_waited(stream.device, order, pending)
    return outputs, False, pending


def answered_shape(info: ModelInfo, result: Any, name: str, spec: Any = None) -> tuple[int, ...]:
    """The shape the server gave output *name* in *result* (gRPC: a protobuf tensor; HTTP: JSON),
    checked against what the client planned from the model's metadata: the output is there, of
    that datatype and of shape that fits its dims -- else :class:`ModelChanged` (the model was
    reloaded otherwise: the slot holds bytes of another meaning, never to be read as planned)."""
    tensor = result.get_output(name)
    if tensor is None:
        raise ModelChanged(f"model {info.name!r} answered without output {name!r}, which it had when the "
                           f"client read it: it changed on the server", status="model changed", model=info.name)
    if isinstance(tensor, dict):
        datatype, shape = tensor["datatype"], tuple(map(int, tensor["shape"]))
    else:
        datatype, shape = tensor.datatype, tuple(tensor.shape)  # (protobuf int64s: ints already)
    if spec is None:
        spec = info.output(name)
    dims = shape[1:] if info.batched else shape
    if datatype != spec.datatype or len(dims) != len(spec.dims) \
            or spec.fixed_dims and any(dims[index] != size for index, size in spec.fixed_dims):
        raise ModelChanged(f"model {info.name!r} answered output {name!r} as {datatype} {list(shape)}, where "
                           f"the client read {spec.datatype} {list(info.shape_of(spec, -1))}: it changed on "
                           f"the server", status="model changed", model=info.name)
    return shape


def answered_shapes(info: ModelInfo, result: Any, names: Sequence[str], ready: Any = None) -> list[tuple[int, ...]]:
    """:func:`check_version`, then :func:`answered_shape` of each of *names*, in order.

    *ready* is the request made ready that *result* answers
    (:class:`~tritonshm._transport.ReadyRequest`), if it was one: its sender hands out the result
    of the last answer again for an answer that is the same, byte for byte -- a warm request's --
    and the shapes read of it for the same *info* and *names* (the same objects: a plan's) are
    kept with it, to be read once, not per request."""
    last = getattr(ready, "last", None)
    if last is not None and last[1] is result:
        read = last[2]
        if read is not None and read[0] is info and read[1] is names:
            return read[2]
    check_version(info, result)
    shapes = [answered_shape(info, result, name) for name in names]
    if last is not None and last[1] is result:
        # (one assignment; a newer answer another thread's request kept meanwhile is lost: parsed again)
        ready.last = (last[0], result, (info, names, shapes))
    return shapes


def check_version(info: ModelInfo, result: Any) -> None:
    """The version the server ran is one it served when the client read the model, else
    :class:`ModelChanged` (a version appeared, or went: the model the client planned for is not
    what ran)."""
    if not info.versions:
        return
    response = result.get_response()
    ran = response.get("model_version", "") if isinstance(response, dict) else response.model_version
    if ran and ran not in info.versions:
        raise ModelChanged(f"model {info.name!r} ran as version {ran}, which it did not serve when the client "
                           f"read it (versions {list(info.versions)}): it changed on the server",
                           status="model changed", model=info.name)


def rows_for(info: ModelInfo, rows: Rows | None, name: str,
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


def wire_results(info: ModelInfo, result: Any, names: Sequence[str], results: Placement,
                 rows: Rows | None = None) -> dict[str, Any]:
    """The outputs of a plain gRPC/HTTP reply, moved to the GPU where *results*
    says; outputs with *rows* go there (and are left out of the dict)."""
    outputs = {}
    if rows is not None and rows.ready is not None:
        _devices.copy_stream(results.device).wait(rows.ready)
    check_version(info, result)
    for name in names:
        array = result.as_numpy(name)
        if array is None or array.dtype != info.output(name).dtype:
            answered_shape(info, result, name)  # (says what changed)
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
