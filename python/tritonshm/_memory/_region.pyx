# cython: language_level=3, embedsignature=True
"""The region lifecycle, written once: :class:`Region`, the base of every region type.

:class:`~._system.SystemRegion` (and :class:`~._pinned.PinnedRegion`, a
system region) and :class:`~._cuda_region.CudaRegion` each own one
reference to a native, reference-counted piece of memory -- a mapping, a
device allocation -- and release it on ``close()``; views hold references
of their own, so memory outlives ``close()`` while a view of it lives.
What each native reference is, how it is released and how its views are
counted stays in its own module.  What is the same for all is here:

* :attr:`~Region.key`, :attr:`~Region.nbytes`, :attr:`~Region.owner` and
  :attr:`~Region.closed`;
* the "live or raise :class:`~tritonshm.RegionClosed`" check every
  operation starts with, and :meth:`~Region.span` on it;
* the context manager (``with`` closes);
* finalisation: a region dropped unclosed is closed, and an owner's (in
  the process that created it) warns with a :class:`ResourceWarning`;
* the ``closed`` / ``owner`` / ``attached`` state word of every ``repr``.

A subclass says whether it is open (``_is_open``), what closing an
unclosed owner did (``_unclosed_note``), and defines ``close()``.
"""

from posix.unistd cimport getpid

import warnings

from ..errors import RegionClosed
from ._args cimport span as _span

__all__ = ["Region"]


cdef class Region:
    """The base of :class:`SystemRegion`, :class:`PinnedRegion` and :class:`CudaRegion`: their common lifecycle.

    Not made directly: each region type has its own ``create`` and
    ``attach``.  A region is open until ``close()``; every operation on a
    closed region raises :class:`~tritonshm.RegionClosed`.
    """

    def __cinit__(self):
        self._key = None
        self._creator_pid = -1

    def __init__(self, *args, **kwargs):
        raise TypeError("Region is the base of the region types: use SystemRegion, PinnedRegion or CudaRegion")

    def __del__(self):
        if not self._is_open():
            return
        leaked = self._owner and getpid() == self._creator_pid
        description = repr(self)
        self.close()  # first: the memory goes whatever the warning filters do
        if leaked:
            # Like CPython's own files and sockets: under -W error the warning
            # becomes an exception, which reaches sys.unraisablehook.
            warnings.warn(
                f"unclosed {description}: {self._unclosed_note()}; use close() or a with-block",
                ResourceWarning,
                source=self,
            )

    cdef bint _is_open(self) noexcept:
        """True while this object holds its native reference; each region type answers for its own."""
        return False  # a bare Region (Region.__new__) holds nothing

    cdef str _unclosed_note(self):
        """What closing an unclosed owner did, for the ResourceWarning."""
        return "it was closed"

    cdef int _check_open(self) except -1:
        """The check every operation starts with: raises :class:`RegionClosed` once closed."""
        if not self._is_open():
            raise RegionClosed(f"{self!r} is closed")
        return 0

    cdef str _state(self):
        """The state word of a repr: ``closed``, ``owner`` or ``attached``."""
        if not self._is_open():
            return "closed"
        return "owner" if self._owner else "attached"

    # -- state ------------------------------------------------------------

    @property
    def key(self):
        """The region's name: a POSIX segment's name (with its leading slash), or a CUDA region's registration name."""
        return self._key

    @property
    def nbytes(self):
        """The usable size of the region in bytes."""
        return self._nbytes

    @property
    def owner(self):
        """True when this object created the memory (and, on close, unlinks or frees it)."""
        return self._owner

    @property
    def closed(self):
        """True after ``close()``."""
        return not self._is_open()

    def span(self, offset=0, nbytes=None):
        """Validate a byte range of this region and return it as ``(offset, nbytes)``.

        *nbytes* defaults to the rest of the region after *offset*.  Negative,
        non-integer, oversized or wrapping values raise :class:`OutOfBounds`;
        nothing is ever truncated.
        """
        self._check_open()
        return _span(self, self._nbytes, offset, nbytes)

    # -- lifetime ---------------------------------------------------------

    def __enter__(self):
        self._check_open()
        return self

    def __exit__(self, *exc_info):
        self.close()
