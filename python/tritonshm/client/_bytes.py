"""Triton's BYTES tensor format: encode into and decode out of shared memory.

Why this module exists
----------------------
Fixed-size tensors go into a shared-memory slot as their raw numpy bytes.
``BYTES`` tensors (strings, blobs) have no fixed element size, so Triton
defines a serialisation for them, the same over the wire and in shared
memory.  tritonclient implements it as ``tritonclient.utils.
serialize_byte_tensor`` / ``deserialize_bytes_tensor``, but the first builds
the whole serialised tensor as a new ``bytes`` object (which the caller then
copies into the slot) and both walk the elements with a slow per-element
loop.  This module writes straight into the slot and reads straight out of
it, with the same bytes on the wire.

The format
----------
The elements, in row-major (C) order, each as::

    <uint32 little-endian length n> <n raw bytes>

with no padding, no header and no terminator: the element count comes from
the tensor's shape, and the serialised size (``4 * count + sum of the
lengths``) is the ``byte_size`` given to Triton.  An element is therefore at
most 2**32 - 1 bytes long.

What is accepted (the same as tritonclient, except where said)
-------------------------------------------------------------
* ``object`` arrays whose elements are ``bytes`` (taken as they are) or
  ``str`` (encoded as UTF-8).  Subclasses count too: an ``np.bytes_`` element
  is its raw bytes and ``np.str_`` its UTF-8 (tritonclient would write
  ``b"b'...'"`` for an ``np.bytes_`` element, its ``str()``), and a
  ``bytearray`` is its bytes.
* ``np.bytes_`` (``'S'``) arrays.  numpy drops the trailing NULs of every
  ``'S'`` element (``np.array([b"a\\0"])[0] == b"a"``), and so does
  tritonclient; we keep that meaning.  Use an ``object`` array to send
  trailing NULs.
* ``np.str_`` (``'U'``) arrays, each element encoded as UTF-8 (numpy drops
  their trailing NULs too).  tritonclient refuses them, but they mean exactly
  the same as an ``object`` array of those ``str`` -- what ``np.array(["a",
  "b"])`` gives by default -- and :class:`tritonshm.Client` already accepts
  them for BYTES inputs (turning them into ``object`` arrays before the wire).
* Anything else that is not an ``ndarray`` is taken as ``np.asarray(x,
  dtype=object)`` (so a list of ``bytes`` never goes through ``'S'`` and
  keeps its trailing NULs).

Refused with :class:`tritonshm.DTypeMismatch`: arrays of any other dtype,
and elements that are neither bytes nor str (``int``, ``None``, lists,
arrays, ...), naming the element's index and type.  tritonclient would
silently send ``str(element)`` (``b"5"``, ``b"None"``), which is never what a
BYTES input means.  A ``str`` that UTF-8 cannot encode (a lone surrogate) is
refused the same way.

Decoding gives what ``deserialize_bytes_tensor`` gives: an ``object`` array
of ``bytes`` (never ``str``: BYTES carries no encoding), reshaped as asked.
A truncated or malformed buffer is refused with
:class:`tritonshm.MalformedBytes` (a ``ValueError``) and nothing past the
buffer is ever read.
Encoding checks everything (types, sizes, room) before it writes a byte.

Speed
-----
Pure Python and numpy.  Encoding: small elements are joined with their
length prefixes in one ``bytes.join`` and copied once (the per-element
Python overhead dominates there, not the copy); large elements are copied
one by one straight into the buffer, so no serialised copy is built.
Decoding: the buffer is read through a bounded ``bytes`` window (slicing
``bytes`` is the cheapest way to make many small ``bytes`` objects), large
elements are copied out directly, and a tensor whose elements all have the
same small length (fixed-width ids, hashes, ...) is decoded without a Python
loop at all.
"""

from __future__ import annotations

import math
import operator
import struct
from typing import Any

import numpy as np

from .. import errors as _errors
from ..errors import DTypeMismatch, OutOfBounds, ReadOnlyRegion, ShapeMismatch, UnsupportedBuffer

__all__ = ["encoded_nbytes", "encode_into", "decode", "MAX_ELEMENT_NBYTES"]

MAX_ELEMENT_NBYTES = 0xFFFF_FFFF
"""The largest element the 32-bit length prefix can describe."""

_Malformed = _errors.MalformedBytes  # what a truncated or malformed serialised tensor raises

_LEN = struct.Struct("<I")
_pack = _LEN.pack
_unpack_from = _LEN.unpack_from

# Encoding: elements at least this long on average are copied one by one into
# the buffer; shorter ones are joined first (measured crossover: about 2 KiB).
_DIRECT_MEAN_NBYTES = 2048
# Decoding: the bytes window read at once (a small one first and after a
# large element, so large elements are not copied twice), and elements at
# least _DIRECT_ELEMENT long are copied out directly, not through the window.
_WINDOW = 1 << 18
_FIRST_WINDOW = 1 << 12
_DIRECT_ELEMENT = _WINDOW // 4
# Decoding: same-length elements up to this long take the vectorised path.
_UNIFORM_MAX = 512
_UNIFORM_MIN_COUNT = 8


# -- element intake ---------------------------------------------------------


def _elements(array: Any) -> tuple[list, tuple[int, ...], bool]:
    """The tensor's elements in row-major order, each a ``bytes`` or ``str``.

    Also its shape (for messages) and whether any element is a ``str``.
    Raises DTypeMismatch for a dtype or an element that is not BYTES.
    """
    if not isinstance(array, np.ndarray):
        array = np.asarray(array, dtype=np.object_)
    kind = array.dtype.kind
    if kind not in "OSU":
        raise DTypeMismatch(
            f"a BYTES tensor must be an object, np.bytes_ ('S') or np.str_ ('U') array, "
            f"not {array.dtype}"
        )
    # ravel(order="C") is the row-major order whatever the memory layout;
    # tolist() turns 'S'/'U' elements into bytes/str (trailing NULs dropped).
    items = array.ravel(order="C").tolist()
    if kind != "O":
        return items, array.shape, kind == "U" and len(items) > 0
    types = set(map(type, items))
    if not types <= {bytes, str}:
        items = _normalise(items, array.shape)
        types = set(map(type, items))
    return items, array.shape, str in types


def _where(i: int, shape: tuple[int, ...]) -> list[int]:
    """The index in *shape* of flat element *i*."""
    return [int(d) for d in np.unravel_index(i, shape)] if shape else []


def _normalise(items: list, shape: tuple[int, ...]) -> list:
    """The slow path: str subclasses made plain str, bytes-likes kept; others refused."""
    out: list[bytes | bytearray | str] = []
    for i, x in enumerate(items):
        if isinstance(x, (bytes, bytearray)):
            out.append(x)  # join, len and buffer writes take them as they are
        elif isinstance(x, str):
            out.append(str.__str__(x))
        else:
            kind = type(x).__qualname__
            if type(x).__module__ != "builtins":
                kind = f"{type(x).__module__}.{kind}"
            raise DTypeMismatch(
                f"element {_where(i, shape)} of a BYTES tensor is {kind}, not bytes or str"
            )
    return out


def _encode_strs(items: list, shape: tuple[int, ...]) -> list[bytes]:
    """*items* with every str encoded as UTF-8."""
    try:
        return [x.encode() if type(x) is str else x for x in items]
    except UnicodeEncodeError as exc:
        for i, x in enumerate(items):
            if type(x) is str:
                try:
                    x.encode()
                except UnicodeEncodeError:
                    raise DTypeMismatch(
                        f"element {_where(i, shape)} of a BYTES tensor is a str that "
                        f"UTF-8 cannot encode ({exc.reason} at {exc.start})"
                    ) from exc
        raise  # pragma: no cover  (the failing element is always found above)


def _utf8_len(x: bytes | str) -> int:
    if type(x) is str and not x.isascii():
        return len(x.encode())
    return len(x)


def _total(lengths: list[int], shape: tuple[int, ...]) -> int:
    """The serialised size for elements of these lengths; refuses a length over 32 bits."""
    total = sum(lengths)
    if total > MAX_ELEMENT_NBYTES:  # only then can one element be too long
        biggest = max(lengths)
        if biggest > MAX_ELEMENT_NBYTES:
            raise OutOfBounds(
                f"element {_where(lengths.index(biggest), shape)} of a BYTES tensor is "
                f"{biggest} bytes; the format's 32-bit length allows at most {MAX_ELEMENT_NBYTES}"
            )
    return 4 * len(lengths) + total


# -- public API -------------------------------------------------------------


def encoded_nbytes(array: Any) -> int:
    """The exact size in bytes of *array* serialised as a Triton BYTES tensor.

    ``4 * array.size`` plus the length of every element (UTF-8 for str).
    Raises :class:`tritonshm.DTypeMismatch` for what :func:`encode_into`
    refuses, and :class:`tritonshm.OutOfBounds` for an element longer than
    :data:`MAX_ELEMENT_NBYTES`.
    """
    items, shape, strs = _elements(array)
    if not strs:
        return _total(list(map(len, items)), shape)
    try:
        lengths = list(map(_utf8_len, items))
    except UnicodeEncodeError:
        _encode_strs(items, shape)  # raises DTypeMismatch naming the element
        raise  # pragma: no cover
    return _total(lengths, shape)


def _writable(buffer: Any) -> memoryview:
    try:
        view = memoryview(buffer)
    except TypeError:
        raise UnsupportedBuffer(
            f"a BYTES tensor is written into a buffer (memoryview, bytearray, numpy array, "
            f"region), not {type(buffer).__name__}"
        ) from None
    if view.readonly:
        raise ReadOnlyRegion("cannot write a BYTES tensor into a read-only buffer")
    return _flat(view)


def _readable(buffer: Any) -> memoryview:
    try:
        view = memoryview(buffer)
    except TypeError:
        raise UnsupportedBuffer(
            f"a BYTES tensor is read from a buffer (bytes, memoryview, numpy array, region), "
            f"not {type(buffer).__name__}"
        ) from None
    return _flat(view)


def _flat(view: memoryview) -> memoryview:
    """*view* as contiguous unsigned bytes (whatever its format and shape)."""
    if not view.c_contiguous:
        raise UnsupportedBuffer("a BYTES tensor needs a C-contiguous buffer")
    if view.ndim == 1 and view.format == "B":
        return view
    return view.cast("B")


def _offset(offset: Any, size: int) -> int:
    try:
        offset = operator.index(offset)
    except TypeError:
        raise OutOfBounds(f"offset must be an integer, not {type(offset).__name__}") from None
    if not 0 <= offset <= size:
        raise OutOfBounds(f"offset {offset} is outside the buffer of {size} bytes")
    return offset


def encode_into(array: Any, buffer: Any, offset: int = 0) -> int:
    """Serialise *array* as a Triton BYTES tensor into *buffer* at *offset*.

    *buffer* is anything writable exporting a C-contiguous buffer (a
    ``memoryview``, ``bytearray``, numpy array -- e.g. a uint8 view of a
    shared-memory slot -- or a region); offsets are in bytes.  Returns the
    number of bytes written, :func:`encoded_nbytes` of *array*.

    Every check happens before the first byte is written: a dtype or element
    that is not BYTES raises :class:`tritonshm.DTypeMismatch`; a buffer too
    small from *offset* (or an offset outside it) raises
    :class:`tritonshm.OutOfBounds`, and the buffer is left untouched.
    """
    items, shape, strs = _elements(array)
    if strs:
        items = _encode_strs(items, shape)
    lengths = list(map(len, items))
    total = _total(lengths, shape)
    out = _writable(buffer)
    start = _offset(offset, len(out))
    if total > len(out) - start:
        raise OutOfBounds(
            f"a BYTES tensor of {len(items)} elements needs {total} bytes; the buffer has "
            f"{len(out) - start} from offset {start}"
        )
    if not items:
        return 0
    if total - 4 * len(items) >= _DIRECT_MEAN_NBYTES * len(items):
        # Large elements: each one straight into the buffer, no serialised copy.
        pos = start
        for item, n in zip(items, lengths):
            out[pos:pos + 4] = _pack(n)
            pos += 4
            out[pos:pos + n] = item
            pos += n
    else:
        # Small elements: one C-level join of prefixes and data, one copy.
        parts = [b""] * (2 * len(items))
        parts[0::2] = map(_pack, lengths)
        parts[1::2] = items
        out[start:start + total] = b"".join(parts)
    return total


def decode(buffer: Any, count: int | None = None, shape: Any = None, *, offset: int = 0) -> np.ndarray:
    """Parse a Triton BYTES tensor out of *buffer* into an object array of bytes.

    * *count* elements are read from *offset*; the bytes after them are
      ignored (the buffer may be a whole slot).
    * ``count=None`` reads elements until the end of the buffer, which must
      end exactly after the last one (tritonclient's
      ``deserialize_bytes_tensor``).
    * *shape* reshapes the result (default: 1-D); its size must be the
      number of elements read, else :class:`tritonshm.ShapeMismatch`.  With
      ``count=None`` it is what the buffer must hold.

    Never reads past the end of *buffer*: an element or length prefix that
    runs past it, or trailing bytes that are not a whole element, raise
    :class:`tritonshm.MalformedBytes` saying which element and where.  Elements
    are always ``bytes`` (BYTES carries no text encoding).
    """
    mv = _readable(buffer)
    end = len(mv)
    pos = _offset(offset, end)
    span = end - pos
    if shape is not None:
        try:
            shape = tuple(operator.index(d) for d in (shape if np.iterable(shape) else (shape,)))
        except TypeError:
            raise ShapeMismatch(f"a shape is a sequence of integers, not {shape!r}") from None
        if any(d < 0 for d in shape):
            raise ShapeMismatch(f"a shape has no negative dimensions: {list(shape)}")
        if count is not None and math.prod(shape) != count:
            raise ShapeMismatch(f"shape {list(shape)} does not hold {count} elements")
    if count is not None:
        try:
            count = operator.index(count)
        except TypeError:
            raise ShapeMismatch(f"count must be an integer, not {type(count).__name__}") from None
        if count < 0:
            raise ShapeMismatch(f"count must not be negative: {count}")
        if 4 * count > span:
            raise _Malformed(
                f"a BYTES tensor of {count} elements needs at least {4 * count} bytes; "
                f"the buffer has {span} from offset {pos}"
            )
    result = _uniform(mv, pos, span, count)
    if result is None:
        items = _parse(mv, pos, end, count)
        result = np.fromiter(items, dtype=np.object_, count=len(items))
    if shape is not None:
        if result.size != math.prod(shape):
            raise ShapeMismatch(
                f"the buffer holds {result.size} BYTES elements; shape {list(shape)} needs "
                f"{math.prod(shape)}"
            )
        result = result.reshape(shape)
    return result


def _uniform(mv: memoryview, pos: int, span: int, count: int | None) -> np.ndarray | None:
    """The vectorised path for elements that all have one small length; None if not so."""
    if span < 4:
        return None
    n = _unpack_from(mv, pos)[0]
    stride = 4 + n
    if n > _UNIFORM_MAX:
        return None
    if count is None:
        if span % stride:
            return None
        count = span // stride
    elif count * stride > span:
        return None
    if count < _UNIFORM_MIN_COUNT:
        return None
    rows = np.frombuffer(mv, np.uint8, count * stride, pos).reshape(count, stride)
    prefixes = np.ascontiguousarray(rows[:, :4]).view("<u4")
    if not (prefixes == n).all():
        return None
    if n == 0:
        result = np.empty(count, dtype=np.object_)
        result.fill(b"")
        return result
    # A void element's object is its bytes, NULs included (unlike 'S').
    return np.ascontiguousarray(rows[:, 4:]).view(f"V{n}").reshape(count).astype(np.object_)


def _parse(mv: memoryview, pos: int, end: int, count: int | None) -> list[bytes]:
    """Elements from *pos*: *count* of them, or (None) up to exactly *end*.

    The buffer is read through a ``bytes`` *window* (at most _WINDOW bytes,
    starting at byte *base* of the buffer).  At the top of the loop the next
    length prefix lies whole inside the window at *r*, so the common case --
    the element and the prefix after it both inside the window -- costs one
    comparison; everything else (the window's edge, the buffer's end, a large
    element, a corrupt length) goes the slow way.
    """
    until_end = count is None
    if count is None:
        if pos == end:
            return []
        limit = (end - pos) // 4 + 1  # more than can fit: the loop ends by returning
    else:
        limit = count
        if limit == 0:
            return []
    if pos + 4 > end:
        raise _Malformed(
            f"BYTES element 0: its 4-byte length at byte {pos} runs past the end of the "
            f"buffer ({end} bytes)"
        )
    items: list[bytes] = []
    append = items.append
    unpack_from = _unpack_from
    base = pos
    window = bytes(mv[base:base + _FIRST_WINDOW])
    inner = len(window) - 4  # an element ending here leaves room for the next prefix
    r = 0
    last = limit - 1
    for i in range(limit):
        r += 4
        e = r + unpack_from(window, r - 4)[0]
        if e <= inner:
            append(window[r:e])
            r = e
            continue
        # The element or the next prefix is not (all) in the window.
        start = base + r
        stop = base + e
        if stop > end:
            raise _Malformed(
                f"BYTES element {i} at byte {start - 4} declares {e - r} bytes; only "
                f"{end - start} remain in the buffer"
            )
        size = _WINDOW
        if e <= inner + 4:
            append(window[r:e])
        elif e - r >= _DIRECT_ELEMENT:
            append(mv[start:stop].tobytes())
            size = _FIRST_WINDOW
        else:
            append(bytes(mv[start:stop]))
        if until_end:
            if stop == end:
                return items
        elif i == last:
            return items
        if stop + 4 > end:
            raise _Malformed(
                f"BYTES element {i + 1}: its 4-byte length at byte {stop} runs past the end "
                f"of the buffer ({end} bytes)"
            )
        base = stop
        window = bytes(mv[base:base + size])
        inner = len(window) - 4
        r = 0
    return items
