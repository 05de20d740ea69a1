"""tritonshm.client._bytes: Triton's BYTES tensor codec against tritonclient's.

The reference is tritonclient.utils.serialize_byte_tensor /
deserialize_bytes_tensor: every round trip is checked in both directions
against them, byte for byte.  The codec's fast paths (joined or direct
writes, the bytes window of the decoder, large elements copied directly, the
vectorised same-length decoder) are each exercised on small data by shrinking
their thresholds (``TUNINGS``), so hypothesis reaches every window edge.
"""

from __future__ import annotations

import contextlib
import math
import re
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

import tritonshm
from tritonshm.client import _bytes
from tritonshm.client._bytes import decode, encode_into, encoded_nbytes

MALFORMED = _bytes._Malformed  # MalformedBytes, or OutOfBounds until that class exists

# Thresholds of the codec, shrunk so small tensors take every path.
TUNINGS = {
    "default": {},
    "tiny": dict(_WINDOW=16, _FIRST_WINDOW=8, _DIRECT_ELEMENT=6, _DIRECT_MEAN_NBYTES=3,
                 _UNIFORM_MAX=2, _UNIFORM_MIN_COUNT=2),
    "direct-writes, no-uniform": dict(_DIRECT_MEAN_NBYTES=0, _UNIFORM_MAX=-1, _WINDOW=64,
                                      _FIRST_WINDOW=4, _DIRECT_ELEMENT=32),
    "uniform-always": dict(_UNIFORM_MAX=1 << 20, _UNIFORM_MIN_COUNT=0),
}


@contextlib.contextmanager
def tuned(name):
    with pytest.MonkeyPatch.context() as mp:
        for attr, value in TUNINGS[name].items():
            assert hasattr(_bytes, attr), attr  # a renamed threshold must not be silently untested
            mp.setattr(_bytes, attr, value)
        yield


def tc_encode(array: np.ndarray) -> bytes:
    """tritonclient's serialisation as bytes (it gives an empty array for no elements)."""
    out = serialize_byte_tensor(array)
    return b"" if array.size == 0 else out.item()


def object_array(items, shape) -> np.ndarray:
    """An object array of exactly these elements (np.array would make 'S'/'U' arrays)."""
    a = np.empty(len(items), dtype=np.object_)
    a[:] = items if items else []
    return a.reshape(shape)


def encode(array, slack=0, offset=0, fill=0xA5) -> tuple[int, bytearray]:
    buf = bytearray([fill]) * (encoded_nbytes(array) + offset + slack)
    return encode_into(array, buf, offset), buf


# -- strategies -------------------------------------------------------------

element = st.one_of(
    st.binary(max_size=40),
    st.text(max_size=20),                                   # non-ASCII, NULs included
    st.sampled_from([b"", "", b"\x00", "\x00", b"a\x00\x00", "\u00e9\x00", "\U0001F600"]),
)
shapes = st.lists(st.integers(0, 4), min_size=0, max_size=3).map(tuple)


@st.composite
def tensors(draw, elements=element):
    shape = draw(shapes)
    items = draw(st.lists(elements, min_size=math.prod(shape), max_size=math.prod(shape)))
    array = object_array(items, shape)
    if array.ndim >= 2 and draw(st.booleans()):
        array = array.T  # a non-C-contiguous view: row-major order is still the logical one
    return array


def utf8(x):
    return x.encode() if isinstance(x, str) else x


# -- round trips against tritonclient ---------------------------------------


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=150, deadline=None)
@given(array=tensors(), offset=st.integers(0, 9), slack=st.integers(0, 9))
def test_encode_matches_tritonclient(tuning, array, offset, slack):
    with tuned(tuning):
        expected = tc_encode(array)
        assert encoded_nbytes(array) == len(expected)
        written, buf = encode(array, slack=slack, offset=offset)
        assert written == len(expected)
        assert bytes(buf[offset:offset + written]) == expected
        # nothing outside [offset, offset + written) was touched
        assert buf[:offset] == bytearray([0xA5]) * offset
        assert buf[offset + written:] == bytearray([0xA5]) * slack
        # and tritonclient reads it back as the elements, in row-major order
        back = deserialize_bytes_tensor(bytes(buf[offset:offset + written]))
        assert back.tolist() == [utf8(x) for x in array.ravel(order="C").tolist()]


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=150, deadline=None)
@given(array=tensors(), offset=st.integers(0, 9), slack=st.integers(0, 9))
def test_decode_matches_tritonclient(tuning, array, offset, slack):
    with tuned(tuning):
        serialized = tc_encode(array)
        buf = bytes(offset) + serialized + b"\xff" * slack  # a slot with garbage after the tensor
        ref = deserialize_bytes_tensor(serialized)
        # count given: exactly that many elements, what follows is ignored
        got = decode(np.frombuffer(buf, np.uint8), array.size, array.shape, offset=offset)
        assert got.dtype == np.object_ and got.shape == array.shape
        assert all(type(x) is bytes for x in got.flat)
        assert got.ravel().tolist() == ref.tolist()
        # count=None: the buffer is the whole tensor (tritonclient's semantics)
        whole = decode(memoryview(serialized), shape=array.shape)
        assert whole.shape == array.shape and whole.ravel().tolist() == ref.tolist()
        assert decode(serialized).tolist() == ref.tolist() and decode(serialized).ndim == 1


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=300, deadline=None)
@given(data=st.one_of(
    st.binary(max_size=64),
    # mostly well-formed streams of small elements, with a random tail cut or added
    st.tuples(st.lists(st.binary(max_size=6), max_size=12), st.integers(-5, 5), st.binary(max_size=5))
    .map(lambda t: _cut(b"".join(struct.pack("<I", len(e)) + e for e in t[0]), t[1], t[2])),
))
def test_decode_arbitrary_bytes_like_tritonclient(tuning, data):
    """On any input, decode(buf) gives deserialize_bytes_tensor's result, or
    refuses exactly where tritonclient fails (a prefix or element cut short)."""
    with tuned(tuning):
        try:
            ref = deserialize_bytes_tensor(data)
        except struct.error:
            with pytest.raises(MALFORMED):
                decode(data)
        else:
            assert decode(data).tolist() == ref.tolist()


def _cut(stream: bytes, delta: int, extra: bytes) -> bytes:
    return stream[:len(stream) + delta] if delta < 0 else stream + extra[:delta]


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.binary(max_size=12), max_size=20))
def test_bytes_arrays_S_match_tritonclient(tuning, items):
    """np.bytes_ arrays: the trailing NULs numpy drops are dropped, as in tritonclient."""
    array = np.array(items, dtype="S") if items else np.array([], dtype="S1")
    with tuned(tuning):
        expected = tc_encode(array)
        written, buf = encode(array)
        assert bytes(buf[:written]) == expected
        assert decode(buf, array.size).tolist() == [x.rstrip(b"\x00") for x in items]


@settings(max_examples=100, deadline=None)
@given(items=st.lists(st.text(max_size=10), max_size=20), shape2=st.booleans())
def test_str_arrays_U_encode_like_object_str(items, shape2):
    """'U' arrays (refused by tritonclient) mean the object array of their str."""
    array = np.array(items, dtype="U") if items else np.array([], dtype="U1")
    if shape2 and len(items) % 2 == 0:
        array = array.reshape(2, -1)
    expected = tc_encode(array.astype(np.object_))
    assert encoded_nbytes(array) == len(expected)
    written, buf = encode(array)
    assert bytes(buf[:written]) == expected


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
@pytest.mark.parametrize("sizes", [
    [1 << 20] * 3,                                  # large elements: direct writes and reads
    [5, 300_000, 0, 7, 70_000, 3] * 2,              # mixed: window edges, direct copies, small runs
    [262_140, 262_144, 262_148, 1],                 # around the decoder's window size
    [16] * 5000,                                    # many same-length elements (vectorised decode)
    [0] * 100,                                      # all empty
])
def test_large_and_mixed_elements(tuning, sizes):
    rng = np.random.default_rng(len(sizes))
    items = [rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes]
    array = object_array(items, (len(items),))
    with tuned(tuning):
        expected = tc_encode(array)
        written, buf = encode(array, slack=3)
        assert written == len(expected) and bytes(buf[:written]) == expected
        assert decode(buf, len(items)).tolist() == items
        assert decode(memoryview(buf)[:written]).tolist() == items


def test_zero_elements():
    for array in (np.empty((0,), np.object_), np.empty((3, 0), np.object_), np.array([], "S1")):
        assert encoded_nbytes(array) == 0
        buf = bytearray(b"xy")
        assert encode_into(array, buf, 2) == 0 and buf == b"xy"  # offset at the very end is fine
        got = decode(buf, 0, array.shape)
        assert got.shape == array.shape and got.dtype == np.object_
    assert decode(b"").shape == (0,)
    assert decode(b"", shape=(2, 0)).shape == (2, 0)


def test_row_major_order_of_non_contiguous_arrays():
    a = object_array([b"a", b"b", b"c", b"d", b"e", b"f"], (2, 3))
    for view in (a.T, np.asfortranarray(a), a[:, ::2]):
        expected = b"".join(struct.pack("<I", len(x)) + x for x in view.ravel(order="C").tolist())
        assert expected == tc_encode(view)
        written, buf = encode(view)
        assert bytes(buf[:written]) == expected
        assert decode(buf, view.size, view.shape).tolist() == view.tolist()


def test_into_a_shared_memory_region():
    array = object_array(["h\u00e9llo", b"\x00\x01", b"", "x" * 5000], (2, 2))
    n = encoded_nbytes(array)
    with tritonshm.SystemRegion.create(n + 100) as region:
        slot = region.ndarray(np.uint8, (n + 100,))
        assert encode_into(array, slot, 100) == n
        assert region.read(np.uint8, (n,), offset=100).tobytes() == tc_encode(array)
        got = decode(slot, 4, (2, 2), offset=100)
        assert got.tolist() == [[utf8(x) for x in row] for row in array.tolist()]
        del slot


def test_element_types():
    """bytes and str subclasses and bytearray are their bytes (not their str())."""
    array = object_array([np.bytes_(b"ab\x00"), np.str_("\u00e9"), bytearray(b"\x00q"), b"z", "s"], (5,))
    written, buf = encode(array)
    assert decode(buf, 5).tolist() == [b"ab\x00", "\u00e9".encode(), b"\x00q", b"z", b"s"]
    # tritonclient writes str(np.bytes_(...)) = "b'ab\\x00'" there: a documented difference
    assert deserialize_bytes_tensor(tc_encode(array))[0] != b"ab\x00"


# -- refusals ---------------------------------------------------------------


@pytest.mark.parametrize("bad, type_name", [
    (5, "int"), (None, "NoneType"), (1.5, "float"), ([b"a"], "list"), ((b"a",), "tuple"),
    ({"a": 1}, "dict"), (np.int32(3), "numpy.int32"), (memoryview(b"a"), "memoryview"),
])
def test_bad_element_types_refused(bad, type_name):
    array = object_array([b"ok", "ok", b"ok", bad], (2, 2))
    message = rf"element \[1, 1\] .* is {type_name}, not bytes or str"
    with pytest.raises(tritonshm.DTypeMismatch, match=message):
        encoded_nbytes(array)
    buf = bytearray(b"\xee") * 64
    with pytest.raises(tritonshm.DTypeMismatch, match=type_name):
        encode_into(array, buf)
    assert buf == bytearray(b"\xee") * 64


def test_nested_array_element_refused():
    array = object_array([b"a", np.array([b"b"], dtype=object)], (2,))
    with pytest.raises(tritonshm.DTypeMismatch, match=r"element \[1\] .* numpy.ndarray"):
        encode_into(array, bytearray(64))


@pytest.mark.parametrize("array", [
    np.arange(4), np.zeros(3, np.float32), np.array([True]), np.zeros(2, "V4"),
    np.zeros(2, [("a", "i4")]),
])
def test_bad_dtypes_refused(array):
    with pytest.raises(tritonshm.DTypeMismatch, match=re.escape(str(array.dtype))):
        encoded_nbytes(array)
    with pytest.raises(tritonshm.DTypeMismatch):
        encode_into(array, bytearray(64))


def test_unencodable_str_refused():
    array = object_array(["fine", "lone \ud800 surrogate"], (2,))
    for call in (lambda: encoded_nbytes(array), lambda: encode_into(array, bytearray(64))):
        with pytest.raises(tritonshm.DTypeMismatch, match=r"element \[1\] .* UTF-8"):
            call()


def test_element_over_32_bits_refused(monkeypatch):
    monkeypatch.setattr(_bytes, "MAX_ELEMENT_NBYTES", 3)  # instead of allocating 4 GiB
    array = object_array([b"abc", b"abcd"], (2,))
    with pytest.raises(tritonshm.OutOfBounds, match=r"element \[1\] .* 4 bytes"):
        encoded_nbytes(array)
    buf = bytearray(64)
    with pytest.raises(tritonshm.OutOfBounds):
        encode_into(array, buf)
    assert buf == bytearray(64)
    assert encoded_nbytes(array[:1]) == 7


@settings(max_examples=50, deadline=None)
@given(array=tensors().filter(lambda a: a.size > 0), offset=st.integers(0, 5), short=st.integers(1, 6))
def test_buffer_too_small_refused_writing_nothing(array, offset, short):
    need = encoded_nbytes(array)
    buf = bytearray(b"\x5a") * max(0, offset + need - short)
    if offset > len(buf):
        with pytest.raises(tritonshm.OutOfBounds, match="offset"):
            encode_into(array, buf, offset)
    else:
        with pytest.raises(tritonshm.OutOfBounds, match=f"needs {need} bytes"):
            encode_into(array, buf, offset)
    assert buf == bytearray(b"\x5a") * len(buf)
    # and one more byte is enough
    buf = bytearray(offset + need)
    assert encode_into(array, buf, offset) == need


def test_offsets_refused():
    array = object_array([b"ab"], (1,))
    for offset in (-1, 7, 100):
        with pytest.raises(tritonshm.OutOfBounds):
            encode_into(array, bytearray(6), offset)
        with pytest.raises(tritonshm.OutOfBounds):
            decode(bytes(6), 1, offset=offset)
    with pytest.raises(tritonshm.OutOfBounds):
        encode_into(array, bytearray(6), 1.0)


def test_unusable_buffers_refused():
    array = object_array([b"ab"], (1,))
    with pytest.raises(tritonshm.ReadOnlyRegion):
        encode_into(array, b"\x00" * 16)
    ro = np.zeros(16, np.uint8)
    ro.flags.writeable = False
    with pytest.raises(tritonshm.ReadOnlyRegion):
        encode_into(array, ro)
    strided = np.zeros(32, np.uint8)[::2]
    with pytest.raises(tritonshm.UnsupportedBuffer):
        encode_into(array, strided)
    with pytest.raises(tritonshm.UnsupportedBuffer):
        encode_into(array, memoryview(bytearray(32))[::2])
    with pytest.raises(tritonshm.UnsupportedBuffer):
        decode(memoryview(bytes(32))[::2], 1)
    with pytest.raises(tritonshm.UnsupportedBuffer):
        encode_into(array, [0] * 16)
    with pytest.raises(tritonshm.UnsupportedBuffer):
        decode("not a buffer", 1)
    # a C-contiguous buffer of another format or shape is taken as its bytes
    wide = np.zeros((2, 2), np.uint32)
    assert encode_into(array, wide) == 6
    assert decode(wide, 1).tolist() == [b"ab"]


def _stream(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(x)) + x for x in items)


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_every_truncation_refused(tuning):
    items = [b"alpha", b"", b"\x00" * 9, b"z" * 40, b"omega"]
    stream = _stream(*items)
    with tuned(tuning):
        for cut in range(len(stream)):
            short = stream[:cut]
            complete = [i for i in range(len(items) + 1) if len(_stream(*items[:i])) == cut]
            if complete:  # a whole number of elements: fine until the end, short of a count
                assert decode(short).tolist() == items[:complete[0]]
            else:
                with pytest.raises(MALFORMED):
                    decode(short)
            with pytest.raises(MALFORMED):
                decode(short, len(items))
            # the same cut inside a larger buffer: a view ending at the cut is all there is
            with pytest.raises(MALFORMED):
                decode(memoryview(stream + b"\x05\x00\x00\x00xxxxx")[:cut], len(items))


@pytest.mark.parametrize("tuning", sorted(TUNINGS))
def test_corrupt_lengths_refused(tuning):
    stream = bytearray(_stream(b"aa", b"bbb", b"cc"))
    last = len(_stream(b"aa", b"bbb"))
    with tuned(tuning):
        for at, value in [(0, 0xFFFF_FFFF), (6, 0x8000_0000), (last, 3), (6, 4)]:
            bad = bytearray(stream)
            struct.pack_into("<I", bad, at, value)
            with pytest.raises(MALFORMED, match="declares"):
                decode(bytes(bad))
            with pytest.raises(MALFORMED):
                decode(bad, 3)
        # one byte short of the stated length leaves a 1-byte tail: not a whole prefix
        bad = bytearray(stream)
        struct.pack_into("<I", bad, last, 1)
        with pytest.raises(MALFORMED, match="4-byte length"):
            decode(bytes(bad))
        assert decode(bytes(bad), 3).tolist() == [b"aa", b"bbb", b"c"]  # a count stops before it


def test_malformed_is_a_tritonshm_value_error():
    with pytest.raises(tritonshm.Error) as info:
        decode(b"\x05\x00\x00\x00ab")
    assert isinstance(info.value, ValueError)
    assert "element 0" in str(info.value) and "5 bytes" in str(info.value)


def test_count_larger_than_the_buffer_can_hold_refused_at_once():
    with pytest.raises(MALFORMED, match="needs at least 4000000000000 bytes"):
        decode(bytes(64), 10**12)
    with pytest.raises(MALFORMED):
        decode(b"", 1)


def test_shape_and_count_checked():
    stream = _stream(b"a", b"b", b"c", b"d")
    assert decode(stream, shape=(2, 2)).tolist() == [[b"a", b"b"], [b"c", b"d"]]
    assert decode(stream, 4, 4).shape == (4,)
    assert decode(stream, 1, ()).shape == ()
    with pytest.raises(tritonshm.ShapeMismatch):
        decode(stream, shape=(3,))          # the buffer holds 4
    with pytest.raises(tritonshm.ShapeMismatch):
        decode(stream, 4, (3,))             # count and shape disagree
    with pytest.raises(tritonshm.ShapeMismatch):
        decode(stream, -1)
    with pytest.raises(tritonshm.ShapeMismatch):
        decode(stream, shape=(-1, 4))
    with pytest.raises(tritonshm.ShapeMismatch):
        decode(stream, "4")


def test_lists_are_object_arrays_not_S():
    """A list of bytes keeps its trailing NULs (np.asarray would drop them via 'S')."""
    items = [b"a\x00", b"\x00"]
    written, buf = encode(items)
    assert decode(buf, 2).tolist() == items
    assert encoded_nbytes(["\u00e9", b""]) == 4 + 2 + 4
