# cython: language_level=3, embedsignature=True
"""Pinned regions: POSIX shared memory page-locked for fast CUDA copies.

A :class:`PinnedRegion` is a :class:`SystemRegion` whose mapping is
registered with ``cudaHostRegister``, so copies between it and a GPU run at
DMA speed (about 4x pageable memory on an H100) and without a staging
buffer.  Triton registers it as *system* shared memory: pinning is per
process, so it speeds our copies (GPU tensor <-> region), not the server's.

The mapping is page-locked once, when the region is made, and unregistered
by the mapping's own last release, just before ``munmap`` -- after every
view is gone, and only in the process that pinned it.
"""

from ._runtime cimport Runtime, current
from ._system cimport SystemRegion
from ._tshm cimport tshm_cuda_pin_mapping

import errno

from ..errors import CudaUnavailable
from ._args cimport device_of as _device_of

__all__ = ["PinnedRegion"]


def _unpickle(str key, bint readonly, int device):
    """Pickle support: attach to the segment by key and pin it in this process."""
    return PinnedRegion.attach(key, readonly=readonly, device=device)


cdef class PinnedRegion(SystemRegion):
    """A :class:`SystemRegion` whose pages are locked (``cudaHostRegister``).

    Everything a system region does -- buffer protocol, numpy views (which
    also export DLPack as host memory), registration with Triton as system
    shared memory -- with CUDA copies at pinned speed.
    """

    @classmethod
    def create(cls, nbytes, device=0):
        """Create a new segment of *nbytes* and pin it under *device*'s guard (its context does the pinning).

        *device* is checked against the device count before the segment is made.
        """
        current().valid_device(device)
        cdef PinnedRegion self = super(PinnedRegion, cls).create(nbytes)
        self._pin(device)
        return self

    @classmethod
    def attach(cls, key, *, readonly=False, device=0):
        """Map the existing segment *key* and pin the mapping in this process."""
        cdef PinnedRegion self = super(PinnedRegion, cls).attach(key, readonly=readonly)
        self._pin(device)
        return self

    cdef _pin(self, device):
        """Page-lock the mapping once, made; on failure close (and unlink) the new region.

        Under *device*'s guard: the registration belongs to the current
        device's context, and a thread that never chose a device would
        otherwise register (and create a context) on device 0.
        """
        cdef Runtime rt
        cdef int dev
        cdef int rc
        _device_of(device)
        try:
            rt = current()
            dev = rt.valid_device(device)
            if not rt.device_info(dev).get("host_register_supported", True):
                raise CudaUnavailable(f"CUDA device {dev} cannot page-lock host memory (cudaHostRegister)")
            rc = tshm_cuda_pin_mapping(rt.rt, dev, self._live_mapping())
            if rc == -errno.EOPNOTSUPP:
                raise CudaUnavailable(
                    f"CUDA device {dev} cannot page-lock read-only memory "
                    f"(cudaDevAttrHostRegisterReadOnlySupported is 0): attach {self.key!r} with "
                    f"readonly=False, or use a plain SystemRegion")
            rt.check(rc, f"page-locking {self.nbytes} bytes of {self.key!r} (cudaHostRegister; "
                     f"containers may cap locked memory: --ulimit memlock=-1)")
        except BaseException:
            self.close()
            raise
        self._device = dev

    @property
    def pinned(self):
        """True: the mapping is page-locked until its last view is gone."""
        return True

    @property
    def device(self):
        """The device whose context pinned the pages (the pages are pinned for all, Portable)."""
        return self._device

    def __reduce__(self):
        self._live_mapping()
        return (_unpickle, (self.key, self.readonly, self._device))
