# cython: language_level=3, embedsignature=True
"""The CUDA runtime: found, ``dlopen``-ed and checked on first use.

Why ``dlopen`` and not ``cimport cuda.bindings``: see :mod:`tritonshm.cuda`.
One :class:`Runtime` is *current* per process; regions keep the runtime
they were made with, so :func:`use` (tests pick a fake runtime this way)
only affects regions made afterwards.
"""

from libc.string cimport memset

from ._tshm cimport (
    TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MAJOR,
    TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MINOR,
    TSHM_CUDA_ATTR_HOST_REGISTER_SUPPORTED,
    TSHM_CUDA_ATTR_MULTIPROCESSOR_COUNT,
    TSHM_CUDA_ATTR_PCI_BUS_ID,
    TSHM_CUDA_ERROR_INITIALIZATION,
    TSHM_CUDA_ERROR_INSUFFICIENT_DRIVER,
    TSHM_CUDA_ERROR_INVALID_CONTEXT,
    TSHM_CUDA_ERROR_INVALID_DEVICE,
    TSHM_CUDA_ERROR_MEMORY_ALLOCATION,
    TSHM_CUDA_ERROR_NO_DEVICE,
    tshm_cuda_device_enter,
    tshm_cuda_device_leave,
    tshm_cuda_error_name,
    tshm_cuda_error_string,
    tshm_cuda_settle,
    tshm_cudart_open,
    tshm_cudart_path,
)

import errno
import os
import threading

from ..errors import CudaError, CudaUnavailable, OutOfBounds, os_error
from ._args cimport device_of as _device_of

__all__ = ["Runtime", "current", "use", "candidates"]

#: Sonames tried through the dynamic loader's own search, newest first.
SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")

# The buffer handed to cudaGetDeviceProperties: larger than any
# cudaDeviceProp (about 1 KiB); only name[256] at offset 0 is read.
cdef enum:
    _PROPS_BYTES = 8192


cdef class Runtime:
    """One loaded CUDA runtime library and the entry points tritonshm uses."""

    def __init__(self, *args, **kwargs):
        raise TypeError("use tritonshm.cuda.runtime_info(), or Runtime.load(path) in tests")

    @staticmethod
    def load(str path):
        """Load the runtime at *path* (a file or a soname); CudaUnavailable if it cannot be."""
        cdef Runtime self = Runtime.__new__(Runtime)
        cdef char why[512]
        why[0] = 0
        rc = tshm_cudart_open(os.fsencode(path), &self.rt, why, sizeof(why))
        if rc != 0:
            raise CudaUnavailable(f"cannot load the CUDA runtime {path!r}: {why.decode(errors='replace')}")
        self.requested = path
        return self

    cdef tshm_cudart *_rt(self) except NULL:
        """The loaded runtime; TypeError for a Runtime made without :meth:`load` (its entry points
        would be NULL)."""
        if self.rt == NULL:
            raise TypeError("this Runtime was not loaded: use tritonshm.cuda.runtime_info(), or Runtime.load(path)")
        return self.rt

    @property
    def library(self):
        """The file the runtime was loaded from."""
        cdef const char *p = tshm_cudart_path(self._rt())
        return os.fsdecode(p) if p != NULL else self.requested

    def versions(self):
        """``(runtime, driver)`` versions as ints (e.g. 12060, 13000); the driver's is 0 without one."""
        cdef int runtime = 0, driver = 0
        cdef tshm_cudart *rt = self._rt()
        tshm_cuda_settle(rt, rt.RuntimeGetVersion(&runtime))
        tshm_cuda_settle(rt, rt.DriverGetVersion(&driver))
        return runtime, driver

    def device_count(self):
        """The number of visible devices; raises CudaUnavailable when there are none."""
        cdef int count = 0
        cdef tshm_cudart *rt = self._rt()
        self.check(tshm_cuda_settle(rt, rt.GetDeviceCount(&count)), "counting CUDA devices")
        if count == 0:
            self.check(TSHM_CUDA_ERROR_NO_DEVICE, "counting CUDA devices")
        return count

    def device_info(self, int device):
        """What the runtime says of *device*, as a dict (no context is created)."""
        cdef char props[_PROPS_BYTES]
        cdef int value = 0
        cdef tshm_cudart *rt = self._rt()
        memset(props, 0, sizeof(props))
        info = {"index": device}
        # Probes: a refusal leaves the key out (and off the thread's last error).
        if tshm_cuda_settle(rt, rt.GetDeviceProperties(<void *>props, device)) == 0:
            props[255] = 0
            info["name"] = props[:255].split(b"\0", 1)[0].decode(errors="replace")
        for key, attr in (("multiprocessors", TSHM_CUDA_ATTR_MULTIPROCESSOR_COUNT),
                          ("pci_bus_id", TSHM_CUDA_ATTR_PCI_BUS_ID),
                          ("cc_major", TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MAJOR),
                          ("cc_minor", TSHM_CUDA_ATTR_COMPUTE_CAPABILITY_MINOR),
                          ("host_register_supported", TSHM_CUDA_ATTR_HOST_REGISTER_SUPPORTED)):
            if tshm_cuda_settle(rt, rt.DeviceGetAttribute(&value, attr, device)) == 0:
                info[key] = value
        if "cc_major" in info and "cc_minor" in info:
            info["compute_capability"] = f"{info.pop('cc_major')}.{info.pop('cc_minor')}"
        if "host_register_supported" in info:
            info["host_register_supported"] = bool(info["host_register_supported"])
        return info

    def mem_info(self, device):
        """``(free, total)`` bytes of *device* (creates its context if needed)."""
        cdef size_t free_bytes = 0, total_bytes = 0
        cdef int previous = 0
        cdef int dev = self.valid_device(device)
        self.check(tshm_cuda_device_enter(self.rt, dev, &previous), f"selecting CUDA device {dev}")
        try:
            self.check(tshm_cuda_settle(self.rt, self.rt.MemGetInfo(&free_bytes, &total_bytes)),
                       "reading device memory")
        finally:
            tshm_cuda_device_leave(self.rt, dev, previous)
        return free_bytes, total_bytes

    cdef int valid_device(self, object device) except -1:
        """*device* as a device number this process has; OutOfBounds (a ValueError) if it has none such.

        Checked before any call that would take the number to the runtime,
        so that a wrong number says how many GPUs there are instead of
        failing later (or in another process) with cudaErrorInvalidDevice.
        The count is read once and kept (a process's devices do not change:
        CUDA reads CUDA_VISIBLE_DEVICES when it starts); a number beyond it
        asks again before it is refused.  So a warm request counts no devices.
        """
        cdef int count = 0
        if type(device) is int and 0 <= device < self._devices_seen:  # (every request asks: no Python call)
            return device
        dev = _device_of(device)
        if dev < self._devices_seen:
            return dev
        cdef tshm_cudart *rt = self._rt()
        self.check(tshm_cuda_settle(rt, rt.GetDeviceCount(&count)), "counting CUDA devices")
        self._devices_seen = count
        if dev >= count:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise OutOfBounds(
                f"device={dev} does not exist: this process sees {count} CUDA GPU{'s' if count != 1 else ''}"
                + (f" (0..{count - 1})" if count > 1 else "")
                + (f" with CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else ""))
        return dev

    def check_device(self, device):
        """*device* as a valid device number of this process (see :meth:`valid_device`); else OutOfBounds."""
        return self.valid_device(device)

    def error_name(self, int code):
        """``cudaGetErrorName(code)``."""
        return tshm_cuda_error_name(self._rt(), code).decode(errors="replace")

    cdef int check(self, int rc, str what) except -1:
        """Raise the tritonshm error for a C-core or CUDA return code; 0 passes."""
        if rc == 0:
            return 0
        if rc < 0:
            if -rc == errno.ERANGE:
                raise OutOfBounds(f"{what}: out of range")
            raise os_error(-rc, what)
        name = tshm_cuda_error_name(self._rt(), rc).decode(errors="replace")
        text = tshm_cuda_error_string(self._rt(), rc).decode(errors="replace")
        detail = f"{what}: {name} ({rc}): {text}"
        if rc == TSHM_CUDA_ERROR_INSUFFICIENT_DRIVER:
            raise CudaUnavailable(f"{detail}; the CUDA driver is missing or older than {self.library}")
        if rc == TSHM_CUDA_ERROR_NO_DEVICE:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            raise CudaUnavailable(f"{detail}; no CUDA GPU is visible"
                                  + (f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""))
        hint = ""
        if rc == TSHM_CUDA_ERROR_MEMORY_ALLOCATION:
            hint = "; the device is out of memory"
        elif rc == TSHM_CUDA_ERROR_INITIALIZATION:
            hint = "; CUDA cannot be used in a process forked after CUDA started: use the 'spawn' start method"
        elif rc == TSHM_CUDA_ERROR_INVALID_DEVICE:
            hint = "; no such device in this process's numbering (CUDA_VISIBLE_DEVICES)"
        elif rc == TSHM_CUDA_ERROR_INVALID_CONTEXT:
            hint = ("; a CUDA IPC handle cannot be opened in the process that exported it: "
                    "use the region itself there, and attach in other processes")
        raise CudaError(detail + hint, rc, name)

    def __repr__(self):
        return f"<Runtime {self.library!r}>" if self.rt != NULL else "<Runtime not loaded>"


cdef Runtime _current = None
cdef object _failure = None   # why locating failed, kept until use() asks again
_lock = threading.Lock()


def candidates():
    """Where the runtime is looked for, in order, as ``(how, path)`` pairs.

    ``$TRITONSHM_CUDART`` alone when set; else the library NVIDIA's
    ``cuda-pathfinder`` finds (the ``nvidia-cuda-runtime`` wheels, a conda
    or system toolkit), then the sonames for the dynamic loader.
    """
    explicit = os.environ.get("TRITONSHM_CUDART")
    if explicit:
        return [("TRITONSHM_CUDART", explicit)]
    found = []
    try:
        from cuda.pathfinder import load_nvidia_dynamic_lib
    except ImportError:
        pass
    else:
        try:
            found.append(("cuda-pathfinder", load_nvidia_dynamic_lib("cudart").abs_path))
        except Exception:  # DynamicLibNotFoundError, or whatever a version raises
            pass
    found.extend(("soname", name) for name in SONAMES)
    return found


def _locate():
    """The first candidate that loads and sees a driver and a device."""
    cdef int count = 0
    cdef Runtime rt
    reasons = []
    tried = set()
    for how, path in candidates():
        try:
            rt = Runtime.load(path)
        except CudaUnavailable as exc:
            reasons.append(str(exc))
            continue
        if rt.library in tried:  # pathfinder and a soname may name one file
            continue
        tried.add(rt.library)
        # No driver or no device is the machine's answer: no other runtime helps.
        if rt.versions()[1] == 0:
            raise CudaUnavailable(f"no NVIDIA driver is installed (libcuda.so.1 not found; "
                                  f"the CUDA runtime {rt.library} is)")
        rc = tshm_cuda_settle(rt.rt, rt.rt.GetDeviceCount(&count))
        if rc == TSHM_CUDA_ERROR_NO_DEVICE or (rc == 0 and count == 0):
            rt.device_count()  # raises the explanation
        try:
            rt.check(rc, f"counting CUDA devices with {rt.library}")
        except CudaUnavailable as exc:  # e.g. a runtime newer than the driver: try the next
            reasons.append(str(exc))
            continue
        return rt
    summary = reasons[-1] if reasons else "no CUDA runtime library found"
    raise CudaUnavailable(f"CUDA is not usable here: {summary}"
                          + (f" (tried {len(reasons)} libraries)" if len(reasons) > 1 else ""))


cpdef Runtime current():
    """The process's runtime, located on first use; CudaUnavailable if there is none."""
    global _current, _failure
    if _current is not None:
        return _current
    with _lock:
        if _current is None:
            if _failure is None:
                try:
                    _current = _locate()
                except CudaUnavailable as exc:
                    _failure = exc
            if _failure is not None:
                raise CudaUnavailable(str(_failure))
    return _current


def use(runtime):
    """Make *runtime* (a :class:`Runtime`, a path, or None to locate again) current.

    Returns the previous one (or None).  Regions already made keep theirs.
    """
    global _current, _failure
    with _lock:
        _failure = None
        previous = _current
        if runtime is None or isinstance(runtime, Runtime):
            _current = runtime
        else:
            _current = Runtime.load(os.fspath(runtime))
    return previous
