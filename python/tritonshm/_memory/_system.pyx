# cython: language_level=3, embedsignature=True
"""POSIX shared-memory regions: :class:`SystemRegion` and :class:`Window`.

A :class:`SystemRegion` owns one reference to a native, reference-counted
mapping (``tshm_mapping`` in csrc/).  Every buffer export -- a memoryview,
the base of a numpy view -- takes a reference of its own, so the memory is
unmapped only when the region is closed *and* the last export is released.
A view that outlives ``close()`` therefore stays valid, and nothing can ever
touch unmapped memory.  The lifecycle (``closed``, ``with``, the
ResourceWarning of a dropped owner) is :class:`~._region.Region`'s.
"""

from cpython.buffer cimport (
    PyBUF_C_CONTIGUOUS,
    PyBUF_FORMAT,
    PyBUF_ND,
    PyBUF_STRIDES,
    PyBUF_WRITABLE,
    PyBuffer_Release,
    PyObject_GetBuffer,
)
from cpython.pyport cimport PY_SSIZE_T_MAX
from posix.unistd cimport close as c_close, getpid

from ._tshm cimport (
    TSHM_NAME_MAX,
    tshm_copy_in,
    tshm_copy_out,
    tshm_mapping,
    tshm_mapping_decref,
    tshm_mapping_incref,
    tshm_mapping_new,
    tshm_segment_create,
    tshm_segment_open,
    tshm_segment_unlink,
)

import errno

import numpy as np

from ..errors import (
    DTypeMismatch,
    InvalidKey,
    OutOfBounds,
    ReadOnlyRegion,
    RegionClosed,
    UnsupportedBuffer,
    os_error,
)
from ._args cimport index as _index, layout as _layout, span as _span

__all__ = ["SystemRegion", "Window"]

# Copies at least this large run with the GIL released: below it the
# release/re-acquire costs more than it lets other threads gain.
cdef size_t _NOGIL_COPY_BYTES = 64 * 1024

# The buffer format of a region: unsigned bytes.
cdef char *_BYTE_FORMAT = b"B"

cdef int _export(Py_buffer *view, object owner, tshm_mapping *m, size_t offset,
                 size_t length, Py_ssize_t *shape, int flags) except -1:
    """Fill *view* with bytes [offset, offset + length) of *m* for *owner*.

    The export takes a reference on the mapping itself (``view.internal``),
    not only on *owner*, so closing a region cannot unmap memory that a
    consumer still uses; :func:`_release` drops it.
    """
    if m == NULL:  # a Window made with Window.__new__, not by SystemRegion.window()
        raise RegionClosed(f"{owner!r} has no memory")
    if (flags & PyBUF_WRITABLE) and m.readonly:
        raise ReadOnlyRegion(f"{owner!r} is mapped read-only: no writable buffer")
    tshm_mapping_incref(m)
    view.internal = <void *>m
    view.buf = <void *>(m.addr + offset)
    view.obj = owner
    view.len = <Py_ssize_t>length
    view.readonly = m.readonly
    view.itemsize = 1
    view.format = _BYTE_FORMAT if (flags & PyBUF_FORMAT) else NULL
    view.ndim = 1
    shape[0] = <Py_ssize_t>length
    view.shape = shape if (flags & PyBUF_ND) == PyBUF_ND else NULL
    view.strides = &view.itemsize if (flags & PyBUF_STRIDES) == PyBUF_STRIDES else NULL
    view.suboffsets = NULL
    return 0


cdef inline void _release(Py_buffer *view) noexcept:
    tshm_mapping_decref(<tshm_mapping *>view.internal)


def _unpickle(str key, bint readonly):
    """Pickle support: attach to the segment by its key in this process."""
    return SystemRegion.attach(key, readonly=readonly)


cdef class SystemRegion(Region):
    """A POSIX shared-memory segment mapped into this process.

    Make one with :meth:`create` (a new segment, which this object owns and
    unlinks on close) or :meth:`attach` (an existing one, by key).  The
    region exports the buffer protocol, hands out zero-copy numpy views with
    :meth:`ndarray`, and copies with :meth:`write` and :meth:`read`.
    """

    #: Which Triton shared-memory extension registers this region.
    kind = "system"

    def __cinit__(self):
        self._mapping = NULL
        self._lock_fd = -1
        self._exports = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("use SystemRegion.create(nbytes) or SystemRegion.attach(key)")

    def __dealloc__(self):
        # Last resort when finalisation did not run (interpreter shutdown):
        # release our reference without calling into Python.
        if self._mapping != NULL:
            tshm_mapping_decref(self._mapping)
            self._mapping = NULL
        self._drop_lock()

    cdef bint _is_open(self) noexcept:
        return self._mapping != NULL

    cdef str _unclosed_note(self):
        return "its segment was unlinked"

    # -- construction -----------------------------------------------------

    @classmethod
    def create(cls, nbytes):
        """Create a new segment of *nbytes* bytes, mapped read-write.

        The segment is created with ``O_CREAT | O_EXCL`` and mode 0600 under
        an unguessable name (``/tritonshm-<pid>-<16 hex>``); its pages are
        reserved now, so a full /dev/shm fails here rather than later.  The
        returned region owns the segment: ``close()`` unlinks it.

        Until close() the region keeps the segment's descriptor open with a
        shared ``flock`` on it, which is how ``tritonshm gc`` tells a live
        owner from a dead one, also from another PID namespace (another
        container sharing /dev/shm), where the pid in the name means
        nothing.  A forked child shares that lock: a segment whose creator
        died stays while a child forked from it runs.
        """
        cdef SystemRegion self
        cdef size_t size
        cdef char name[TSHM_NAME_MAX + 1]
        cdef int fd = -1
        cdef int rc
        n = _index(nbytes, "nbytes")
        if n <= 0:
            raise OutOfBounds(f"a region needs a positive size, not nbytes={n}")
        if n > PY_SSIZE_T_MAX:
            raise OutOfBounds(f"nbytes={n} is larger than any segment this system can map")
        size = n
        with nogil:
            rc = tshm_segment_create(size, name, sizeof(name), &fd)
        if rc != 0:
            raise os_error(-rc, f"cannot create a shared-memory segment of {n} bytes")
        key = name.decode("ascii")
        self = cls.__new__(cls)
        try:
            self._map_fd(fd, key, size, False)
        except BaseException:
            tshm_segment_unlink(name)
            c_close(fd)
            raise
        self._lock_fd = fd  # from now on close() and __dealloc__ close it
        self._owner = True
        self._creator_pid = getpid()
        return self

    @classmethod
    def attach(cls, key, *, readonly=False):
        """Map the existing segment named *key* (e.g. another region's ``key``).

        The region does not own the segment: ``close()`` unmaps but never
        unlinks.  With ``readonly=True`` the memory is mapped read-only,
        writable buffer exports are refused and numpy views are read-only.
        """
        cdef SystemRegion self
        cdef int fd = -1
        cdef size_t size = 0
        cdef int rc
        if not isinstance(key, str):
            raise InvalidKey(f"a segment key is a str, not {type(key).__name__}")
        try:
            ckey = key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidKey(f"segment key {key!r} cannot be encoded as UTF-8") from None
        if b"\0" in ckey:
            raise InvalidKey(f"segment key {key!r} contains a NUL byte")
        rc = tshm_segment_open(ckey, readonly, &fd, &size)
        if rc == -errno.EINVAL:
            raise InvalidKey(
                f"{key!r} is not a shared-memory key: it must be '/' then 1-254 characters without '/'"
            )
        if rc != 0:
            raise os_error(-rc, f"cannot attach to shared-memory segment {key!r}", key)
        self = cls.__new__(cls)
        try:
            self._map_fd(fd, key, size, readonly)
        finally:
            c_close(fd)
        self._owner = False
        return self

    cdef _map_fd(self, int fd, str key, size_t size, bint readonly):
        cdef tshm_mapping *m = NULL
        cdef int rc
        rc = tshm_mapping_new(fd, size, readonly, &m)
        if rc != 0:
            raise os_error(-rc, f"cannot map shared-memory segment {key!r} ({size} bytes)", key)
        self._mapping = m
        self._key = key
        self._nbytes = size
        self._readonly = readonly
        self._buffer_shape[0] = <Py_ssize_t>size

    # -- state ------------------------------------------------------------

    @property
    def readonly(self):
        """True when the memory is mapped read-only."""
        return self._readonly

    @property
    def exports(self):
        """The number of live buffer exports (memoryviews, numpy views) of this region."""
        return self._exports

    cdef void _drop_lock(self) noexcept:
        """Close the owner's lock descriptor (this process's copy of it, in a forked child)."""
        cdef int fd = self._lock_fd
        self._lock_fd = -1
        if fd >= 0:
            c_close(fd)

    def __repr__(self):
        ro = " readonly" if self._readonly else ""
        return f"<{type(self).__name__} {self._key!r} nbytes={self._nbytes} {self._state()}{ro}>"

    cdef tshm_mapping *_live_mapping(self) except NULL:
        self._check_open()
        return self._mapping

    # -- lifetime ---------------------------------------------------------

    def close(self):
        """Release this region; idempotent.

        An owner unlinks the segment's name at once (never in a forked
        child: the parent still owns it), then drops its lock on it.  The
        memory is unmapped when the last export (memoryview, numpy view) is
        released, so views that outlive ``close()`` stay valid.
        """
        cdef tshm_mapping *m = self._mapping
        cdef int rc = 0
        if m == NULL:
            return
        self._mapping = NULL
        if self._owner and getpid() == self._creator_pid:
            rc = tshm_segment_unlink(self._key.encode("utf-8"))
        # After the unlink: while the name exists, its owner's lock is held.
        # In a forked child this closes only the child's copy; the parent's
        # lock stays (closing never releases a lock other copies share).
        self._drop_lock()
        tshm_mapping_decref(m)
        if rc != 0 and rc != -errno.ENOENT:
            raise os_error(-rc, f"cannot unlink shared-memory segment {self._key!r}", self._key)

    def __reduce__(self):
        self._live_mapping()
        return (_unpickle, (self._key, self._readonly))

    # -- buffer protocol --------------------------------------------------

    def __getbuffer__(self, Py_buffer *view, int flags):
        _export(view, self, self._live_mapping(), 0, self._nbytes, self._buffer_shape, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        _release(view)
        self._exports -= 1

    def window(self, offset=0, nbytes=None):
        """A :class:`Window` on bytes [offset, offset + nbytes) of this region.

        The window holds the mapping itself, so it (and every view made from
        it) stays valid after this region is closed.  *nbytes* defaults to
        the rest of the region.
        """
        cdef Window w
        cdef tshm_mapping *m
        off, size = self.span(offset, nbytes)
        m = self._live_mapping()  # span() can run __index__ code that closes us
        w = Window.__new__(Window)
        tshm_mapping_incref(m)
        w._mapping = m
        w._key = self._key
        w._offset = off
        w._nbytes = size
        return w

    # -- numpy and copies -------------------------------------------------

    def ndarray(self, dtype, shape, offset=0):
        """A zero-copy numpy view of *shape* x *dtype* starting at byte *offset*.

        The view keeps the mapping alive (it is a buffer export), so it stays
        valid after :meth:`close`.  Read-only regions give read-only views.
        """
        dt, dims, nbytes = _layout(dtype, shape)
        off, _ = self.span(offset, nbytes)
        return np.frombuffer(self, dtype=dt, count=nbytes // dt.itemsize, offset=off).reshape(dims)

    def write(self, obj, offset=0):
        """Copy the bytes of *obj* (any C-contiguous buffer) in at *offset*.

        Returns the number of bytes written.  Nothing is written unless the
        whole of *obj* fits.
        """
        cdef Py_buffer src
        self._live_mapping()
        if self._readonly:
            raise ReadOnlyRegion(f"{self!r} is mapped read-only: cannot write")
        if isinstance(obj, np.ndarray) and obj.dtype.hasobject:
            raise DTypeMismatch(f"cannot write an array of dtype {obj.dtype} (Python objects) to shared memory")
        try:
            PyObject_GetBuffer(obj, &src, PyBUF_C_CONTIGUOUS)
        except (BufferError, TypeError, ValueError) as exc:
            if isinstance(obj, np.ndarray) and obj.flags.c_contiguous:
                # numpy cannot export some dtypes (datetime64, ...) through
                # the buffer protocol; their bytes are still plain memory.
                return self.write(obj.reshape(-1).view(np.uint8), offset)
            raise UnsupportedBuffer(
                f"write() needs an object exporting a C-contiguous buffer; "
                f"{type(obj).__name__} does not ({exc}); try numpy.ascontiguousarray()"
            ) from None
        try:
            off, length = self.span(offset, src.len)
            self._copy(True, off, src.buf, length)
        finally:
            PyBuffer_Release(&src)
        return length

    def read(self, dtype, shape, offset=0):
        """A copy of *shape* x *dtype* read from byte *offset*, as a new numpy array."""
        cdef Py_buffer dst
        dt, dims, nbytes = _layout(dtype, shape)
        off, length = self.span(offset, nbytes)
        # Copy into a byte array and reinterpret it: every dtype works,
        # including those numpy cannot export through the buffer protocol.
        out = np.empty(length, dtype=np.uint8)
        PyObject_GetBuffer(out, &dst, PyBUF_WRITABLE)
        try:
            self._copy(False, off, dst.buf, length)
        finally:
            PyBuffer_Release(&dst)
        return out.view(dt).reshape(dims)

    cdef int _copy(self, bint into_region, size_t offset, void *buf, size_t length) except -1:
        """Copy *length* bytes between *buf* and the region at *offset* (checked in C too)."""
        cdef int rc
        # Look the mapping up only now: converting the caller's arguments can
        # run Python code (__index__) that closed us and freed the old one.
        cdef tshm_mapping *m = self._live_mapping()
        tshm_mapping_incref(m)  # a concurrent close() must not unmap under the copy
        if length >= _NOGIL_COPY_BYTES:
            with nogil:
                rc = (tshm_copy_in(m, offset, buf, length) if into_region
                      else tshm_copy_out(m, offset, buf, length))
        else:
            rc = (tshm_copy_in(m, offset, buf, length) if into_region
                  else tshm_copy_out(m, offset, buf, length))
        tshm_mapping_decref(m)
        if rc != 0:
            raise os_error(-rc, f"cannot {'write to' if into_region else 'read from'} {self!r}", self._key)
        return 0


cdef class Window:
    """A byte range of a region that exports the buffer protocol on its own.

    Made by :meth:`SystemRegion.window`.  A window holds a reference on the
    region's mapping, so it and every view made from it stay valid after the
    region is closed; the reference goes when the window and its views do.
    That makes a window a lease: ``weakref.finalize(window, ...)`` runs once
    nothing can touch its bytes any more (the client's slot pools use this).
    """

    def __cinit__(self):
        self._mapping = NULL
        self._exports = 0

    def __init__(self, *args, **kwargs):
        raise TypeError("use SystemRegion.window(offset, nbytes)")

    def __dealloc__(self):
        if self._mapping != NULL:
            tshm_mapping_decref(self._mapping)
            self._mapping = NULL

    @property
    def key(self):
        """The key of the region this window belongs to."""
        return self._key

    @property
    def offset(self):
        """Where the window starts in its region, in bytes."""
        return self._offset

    @property
    def nbytes(self):
        """The size of the window in bytes."""
        return self._nbytes

    @property
    def readonly(self):
        """True when the memory is mapped read-only."""
        return self._mapping != NULL and bool(self._mapping.readonly)

    @property
    def exports(self):
        """The number of live buffer exports (memoryviews, numpy views) of this window."""
        return self._exports

    def __repr__(self):
        return f"<Window {self._key!r} offset={self._offset} nbytes={self._nbytes}>"

    def __reduce__(self):
        raise TypeError("a Window cannot be pickled; pickle its region and call window() there")

    def __getbuffer__(self, Py_buffer *view, int flags):
        _export(view, self, self._mapping, self._offset, self._nbytes, self._buffer_shape, flags)
        self._exports += 1

    def __releasebuffer__(self, Py_buffer *view):
        _release(view)
        self._exports -= 1

    def ndarray(self, dtype, shape, offset=0):
        """A zero-copy numpy view of *shape* x *dtype* at byte *offset* of the window."""
        dt, dims, nbytes = _layout(dtype, shape)
        off, _ = _span(self, self._nbytes, offset, nbytes)
        return np.frombuffer(self, dtype=dt, count=nbytes // dt.itemsize, offset=off).reshape(dims)
