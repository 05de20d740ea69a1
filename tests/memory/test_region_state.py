"""Stateful property test: random sequences of region operations against a model.

The model keeps the bytes every segment must hold, which names are still in
/dev/shm, and how many views we hold of each region object.  After every
step, every live view must show the model's bytes, every region's
``exports`` must equal the views we hold of it, and closed regions must
refuse work with RegionClosed.  Views are kept across close(), across the
owner unlinking the name, and across dropping the region object itself.
"""

from __future__ import annotations

import errno
import gc
import os
import pickle
import warnings

import numpy as np
import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    rule,
)

from tritonshm import (
    OutOfBounds,
    ReadOnlyRegion,
    RegionClosed,
    SharedMemoryOSError,
    SystemRegion,
)

MAX_SIZE = 5000
OFFSETS = st.one_of(st.integers(-2, MAX_SIZE + 2), st.sampled_from([2**63, 2**64 - 1, -(2**63)]))
VIEW_DTYPES = ["u1", "i2", "f4", "c16"]


class Handle:
    """One SystemRegion object we hold, and what the model expects of it.

    Steps never keep the region in a local variable of their own, so that
    setting ``region`` to None really drops our only reference.
    """

    def __init__(self, region: SystemRegion, owner: bool, readonly: bool):
        self.region = region
        self.key = region.key
        self.owner = owner
        self.readonly = readonly
        self.closed = False
        self.dropped = False
        self.views = 0  # live views (buffer exports) we hold of this object

    def __repr__(self):
        return f"Handle({self.key!r}, owner={self.owner}, readonly={self.readonly})"


class View:
    """A numpy array or memoryview over [offset, offset + nbytes) of a segment."""

    def __init__(self, obj, handle: Handle, offset: int, nbytes: int):
        self.obj = obj
        self.handle = handle
        self.offset = offset
        self.nbytes = nbytes

    def raw(self):
        """The view's bytes, as a writable-if-possible flat uint8 array."""
        return np.asarray(self.obj).reshape(-1).view(np.uint8)

    def __repr__(self):
        return f"View({type(self.obj).__name__}, {self.handle.key!r}, {self.offset}, {self.nbytes})"


def fits(size: int, offset: int, nbytes: int) -> bool:
    return 0 <= offset <= size and 0 <= nbytes <= size - offset


class RegionMachine(RuleBasedStateMachine):
    regions = Bundle("regions")
    views = Bundle("views")

    def __init__(self):
        super().__init__()
        self.contents: dict[str, bytearray] = {}  # key -> what the segment holds
        self.linked: dict[str, bool] = {}  # key -> name still in /dev/shm
        self.handles: list[Handle] = []
        self.live_views: list[View] = []

    # -- making regions ---------------------------------------------------

    def _track(self, region, owner, readonly) -> Handle:
        handle = Handle(region, owner, readonly)
        assert (region.owner, region.readonly, region.closed, region.exports) == (owner, readonly, False, 0)
        assert region.nbytes == len(self.contents[handle.key])
        self.handles.append(handle)
        return handle

    # A first region from the start, so every rule can run from step one.
    @initialize(target=regions, size=st.integers(1, MAX_SIZE))
    def first_region(self, size):
        return self.create(size)

    @rule(target=regions, size=st.integers(1, MAX_SIZE))
    def create(self, size):
        region = SystemRegion.create(size)
        self.contents[region.key] = bytearray(size)  # new segments are zero-filled
        self.linked[region.key] = True
        return self._track(region, owner=True, readonly=False)

    @rule(target=regions, src=regions, readonly=st.booleans())
    def attach(self, src, readonly):
        if not self.linked[src.key]:
            try:
                SystemRegion.attach(src.key, readonly=readonly)
            except SharedMemoryOSError as e:
                assert e.errno == errno.ENOENT
            else:
                raise AssertionError("attached to an unlinked name")
            return multiple()
        return self._track(SystemRegion.attach(src.key, readonly=readonly), owner=False, readonly=readonly)

    @rule(target=regions, src=regions)
    def pickle_roundtrip(self, src):
        if src.closed:
            with pytest.raises(RegionClosed):
                pickle.dumps(src.region)
            return multiple()
        data = pickle.dumps(src.region)
        if not self.linked[src.key]:
            try:
                pickle.loads(data)
            except SharedMemoryOSError as e:
                assert e.errno == errno.ENOENT
            else:
                raise AssertionError("unpickled (attached) an unlinked name")
            return multiple()
        return self._track(pickle.loads(data), owner=False, readonly=src.readonly)

    # -- views --------------------------------------------------------------

    @rule(
        target=views,
        handle=regions,
        dtype=st.sampled_from(VIEW_DTYPES),
        offset=OFFSETS,
        count=st.integers(0, 700),
    )
    def ndarray_view(self, handle, dtype, offset, count):
        nbytes = count * np.dtype(dtype).itemsize
        if handle.closed:
            with pytest.raises(RegionClosed):
                handle.region.ndarray(dtype, count, offset=offset)
            return multiple()
        if not fits(len(self.contents[handle.key]), offset, nbytes):
            with pytest.raises(OutOfBounds):
                handle.region.ndarray(dtype, count, offset=offset)
            return multiple()
        array = handle.region.ndarray(dtype, count, offset=offset)
        assert array.flags.writeable == (not handle.readonly)
        return self._add_view(View(array, handle, offset, nbytes))

    @rule(target=views, handle=regions, data=st.data())
    def memoryview_slice(self, handle, data):
        if handle.closed:
            with pytest.raises(RegionClosed):
                memoryview(handle.region)
            return multiple()
        size = len(self.contents[handle.key])
        start = data.draw(st.integers(0, size), label="start")
        stop = data.draw(st.integers(start, size), label="stop")
        # Only the slice survives: it keeps the export the parent took.
        mv = memoryview(handle.region)[start:stop]
        assert mv.readonly == handle.readonly
        return self._add_view(View(mv, handle, start, stop - start))

    def _add_view(self, view):
        view.handle.views += 1
        self.live_views.append(view)
        return view

    @rule(view=views, data=st.data())
    def write_through_view(self, view, data):
        pos = data.draw(st.integers(0, view.nbytes), label="pos")
        payload = data.draw(st.binary(max_size=view.nbytes - pos), label="payload")
        raw = view.raw()
        if view.handle.readonly:
            with pytest.raises((ValueError, TypeError)):  # numpy / memoryview: read-only
                raw[pos : pos + len(payload)] = np.frombuffer(payload, np.uint8)
            return
        raw[pos : pos + len(payload)] = np.frombuffer(payload, np.uint8)
        start = view.offset + pos
        self.contents[view.handle.key][start : start + len(payload)] = payload

    # -- copies -------------------------------------------------------------

    @rule(handle=regions, offset=OFFSETS, payload=st.binary(max_size=600))
    def write(self, handle, offset, payload):
        if handle.closed:
            with pytest.raises(RegionClosed):
                handle.region.write(payload, offset=offset)
        elif handle.readonly:
            with pytest.raises(ReadOnlyRegion):
                handle.region.write(payload, offset=offset)
        elif not fits(len(self.contents[handle.key]), offset, len(payload)):
            with pytest.raises(OutOfBounds):
                handle.region.write(payload, offset=offset)
        else:
            assert handle.region.write(payload, offset=offset) == len(payload)
            self.contents[handle.key][offset : offset + len(payload)] = payload

    @rule(handle=regions, offset=OFFSETS, nbytes=st.integers(0, 700))
    def read(self, handle, offset, nbytes):
        if handle.closed:
            with pytest.raises(RegionClosed):
                handle.region.read(np.uint8, nbytes, offset=offset)
        elif not fits(len(self.contents[handle.key]), offset, nbytes):
            with pytest.raises(OutOfBounds):
                handle.region.read(np.uint8, nbytes, offset=offset)
        else:
            got = handle.region.read(np.uint8, nbytes, offset=offset).tobytes()
            assert got == self.contents[handle.key][offset : offset + nbytes]

    # -- lifetime -----------------------------------------------------------

    @rule(handle=regions)
    def close(self, handle):
        handle.region.close()
        self._closed(handle)

    def _closed(self, handle):
        if handle.owner and not handle.closed:
            self.linked[handle.key] = False
        handle.closed = True

    @rule(handle=consumes(regions))
    def drop_region(self, handle):
        handle.dropped = True
        self._release(lambda: setattr(handle, "region", None), handle)

    @rule(view=consumes(views))
    def drop_view(self, view):
        handle = view.handle
        handle.views -= 1
        self.live_views.remove(view)
        self._release(lambda: setattr(view, "obj", None), handle)

    def _release(self, drop_reference, handle):
        """Drop a reference; the region object goes once it is dropped and has no views."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            drop_reference()
            gc.collect()
        finalized = handle.dropped and handle.views == 0
        expect_warning = finalized and handle.owner and not handle.closed
        resource_warnings = [w for w in caught if issubclass(w.category, ResourceWarning)]
        assert len(resource_warnings) == int(expect_warning), resource_warnings
        if finalized:
            self._closed(handle)  # finalization closes (and an owner unlinks)

    @rule()
    def collect(self):
        gc.collect()  # nothing we hold is in a cycle: nothing may change

    # -- invariants ---------------------------------------------------------

    @invariant()
    def regions_match_model(self):
        for handle in self.handles:
            if handle.dropped:
                continue
            region = handle.region
            assert region.closed == handle.closed
            assert region.exports == handle.views
            if handle.closed:
                with pytest.raises(RegionClosed):
                    region.span()

    @invariant()
    def views_show_the_segment(self):
        for view in self.live_views:
            expected = self.contents[view.handle.key][view.offset : view.offset + view.nbytes]
            assert view.raw().tobytes() == expected

    @invariant()
    def names_match_model(self):
        for key, linked in self.linked.items():
            assert os.path.exists("/dev/shm" + key) == linked

    def teardown(self):
        for handle in self.handles:
            if handle.region is not None:
                handle.region.close()
                handle.region = None
        with warnings.catch_warnings():
            # Regions dropped while views were alive finalize here, unclosed
            # owners with a ResourceWarning: that path is checked in the steps.
            warnings.simplefilter("ignore", ResourceWarning)
            for view in self.live_views:
                view.obj = None
            self.handles.clear()
            self.live_views.clear()
            gc.collect()
        for key in self.linked:
            assert not os.path.exists("/dev/shm" + key)
        with open("/proc/self/maps") as maps:
            mapped = maps.read()
        assert not [key for key in self.linked if f"/dev/shm{key}" in mapped]


RegionMachine.TestCase.settings = settings(max_examples=75, stateful_step_count=30, deadline=None)
TestRegionStateMachine = RegionMachine.TestCase
