"""The ways of sending one identity request that ``tritonshm bench`` compares.

Each method is a class: :meth:`Method.open` makes what a user of that way
would make once (clients, regions, registrations), :meth:`Method.call` is
the per-request work -- the part that is timed -- and returns the output as
an array, :meth:`Method.close` undoes ``open``.  :meth:`Method.stage` runs
untimed before every call and is empty except for the floor, whose inputs
are by definition already in place.  An ``open`` that finds something it
needs missing raises :class:`Unavailable`: the
method is then left out of the run with that message.

The harness instantiates every method afresh for each size, so one size's
pools and regions never serve another.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import secrets
from typing import Any

import numpy as np

from .._transport import GRPC, HTTP, Transport
from ..demo import _page_round
from ..errors import Error

#: Input and output names of the bundled identity models.
INPUT, OUTPUT = "INPUT0", "OUTPUT0"

#: A method's status when the run has no address for its protocol.
NO_HTTP = "no HTTP address: pass --http-url with --url"
NO_GRPC = "no gRPC address: --url gave the HTTP URL alone"

#: Bench dtype name -> (identity model, Triton datatype, numpy dtype).
MODELS = {
    "fp32": ("identity_fp32", "FP32", np.dtype(np.float32)),
    "uint8": ("identity_uint8", "UINT8", np.dtype(np.uint8)),
}


class Unavailable(Error):
    """Raised by a method's ``open()`` when something it needs is not there (an API of this
    tritonshm, a library): the method is left out of the run, with the message as its status."""


@dataclasses.dataclass(frozen=True)
class Setting:
    """What every method of one size needs: where, which model, how big."""

    url: str | None     # gRPC host:port (None: only an HTTP address was given; the gRPC methods sit out)
    model: str
    datatype: str       # Triton's name, "FP32"
    dtype: np.dtype
    count: int          # elements of the 1-D input
    http_url: str | None = None  # HTTP host:port of the same server (None: the HTTP methods sit out)

    @property
    def nbytes(self) -> int:
        return self.count * self.dtype.itemsize

    def require_grpc(self) -> str:
        """The gRPC host:port; :class:`Unavailable` when none was given."""
        if self.url is None:
            raise Unavailable(NO_GRPC)
        return self.url

    def require_http(self) -> str:
        """The HTTP host:port; :class:`Unavailable` when none was given."""
        if self.http_url is None:
            raise Unavailable(NO_HTTP)
        return self.http_url

    def client_url(self, http: bool) -> str:
        """What a tritonshm client is made with: the gRPC address, or the HTTP one as http://."""
        return "http://" + self.require_http() if http else self.require_grpc()

    def wire_args(self, x: np.ndarray, wire: Transport) -> tuple[list, list]:
        """A plain request's inputs and outputs for tritonclient flavour *wire*: *x* inside the
        message, the output asked for inside the reply (HTTP: as binary data, both ways)."""
        infer_input = wire.infer_input(INPUT, [self.count], self.datatype)
        infer_input.set_data_from_numpy(x)
        return [infer_input], [wire.requested_output(OUTPUT)]


class Method:
    """One way of sending the request; subclasses fill in the four steps."""

    #: Short name: the table's row, the JSON key, the ``--methods`` choice.
    name = ""
    #: "peer" (what tritonshm competes with), "tritonshm" (its own API) or
    #: "reference" (the floor and the memcpy the limit is made of).
    group = ""
    #: One line for ``--help`` and the JSON metadata.
    description = ""

    def __init__(self, setting: Setting):
        self.setting = setting

    @property
    def key(self) -> str:
        """What the harness files this instance's samples under (unique in one run): the name."""
        return self.name

    @classmethod
    def missing(cls) -> str | None:
        """Why this method cannot run here (a package is not installed), or None."""
        return None

    def open(self) -> None:
        """Once per size, untimed: clients, regions, registrations."""

    def stage(self, x: np.ndarray) -> None:
        """Before every call, untimed: put *x* where the method expects its input."""

    def call(self, x: np.ndarray) -> np.ndarray:
        """One request with input *x*, timed; returns the output."""
        raise NotImplementedError

    def sample(self, t0: float, t1: float) -> Any:
        """What one timed call, from *t0* to *t1* (``time.perf_counter()``), adds to this method's
        samples, once its output is checked: its seconds.  (A streaming method adds the time to its
        first response too.)"""
        return t1 - t0

    def close(self) -> None:
        """Undo :meth:`open`; must cope with an ``open`` that failed halfway.  By default: close
        ``self.client`` if ``open`` made one (a tritonshm client unregisters its regions too)."""
        client = getattr(self, "client", None)
        if client is not None:
            client.close()


def _grpc_client(url: str) -> Any:
    import tritonclient.grpc as grpcclient

    return grpcclient.InferenceServerClient(url)


class Grpc(Method):
    name = "grpc"
    group = "peer"
    description = "plain gRPC (tritonclient.grpc): the tensor travels inside the request and the reply"

    def open(self) -> None:
        self.client = _grpc_client(self.setting.require_grpc())

    def call(self, x: np.ndarray) -> np.ndarray:
        return self.host_call(x)

    def host_call(self, x: np.ndarray) -> np.ndarray:
        """The per-request work on host arrays: *x* into the request, the reply's array out."""
        inputs, outputs = self.setting.wire_args(x, GRPC)
        return self.client.infer(self.setting.model, inputs, outputs=outputs).as_numpy(OUTPUT)


class Http(Method):
    name = "http"
    group = "peer"
    description = "plain HTTP (tritonclient.http): the tensor travels inside the request and the reply, binary"

    def open(self) -> None:
        import tritonclient.http as httpclient

        self.client = httpclient.InferenceServerClient(self.setting.require_http())

    def call(self, x: np.ndarray) -> np.ndarray:
        inputs, outputs = self.setting.wire_args(x, HTTP)
        return self.client.infer(self.setting.model, inputs, outputs=outputs).as_numpy(OUTPUT)


class TwoRegions(Method):
    """A tritonclient peer with an input and an output region, made and registered once.

    :meth:`open` makes a client and, for ``"in"`` and ``"out"``, a region
    named ``<tag>-<pid>-<random>-in``/``-out`` (:meth:`create_region`) that
    it registers (:meth:`register_region`); :meth:`close` unregisters what
    was registered (:meth:`unregister_region`) and destroys what was made
    (:meth:`destroy_region`), coping with an ``open`` that failed halfway.
    :meth:`infer` is the request bound to the two regions.
    """

    #: The regions' name prefix.
    tag = ""

    def create_region(self, name: str) -> Any:
        raise NotImplementedError

    def register_region(self, client: Any, name: str, handle: Any) -> None:
        raise NotImplementedError

    def unregister_region(self, client: Any, name: str) -> None:
        raise NotImplementedError

    def destroy_region(self, handle: Any) -> None:
        raise NotImplementedError

    def open(self) -> None:
        tag = f"{self.tag}-{os.getpid()}-{secrets.token_hex(6)}"
        self.names = {"in": f"{tag}-in", "out": f"{tag}-out"}
        self.handles: dict[str, Any] = {}
        self.registered: list[str] = []
        self.client = _grpc_client(self.setting.require_grpc())
        for which, name in self.names.items():
            self.handles[which] = self.create_region(name)
            self.register_region(self.client, name, self.handles[which])
            self.registered.append(name)

    def infer(self) -> None:
        """One request reading its input from the "in" region and writing its output to "out"."""
        import tritonclient.grpc as grpcclient

        s = self.setting
        infer_input = grpcclient.InferInput(INPUT, [s.count], s.datatype)
        infer_input.set_shared_memory(self.names["in"], s.nbytes)
        requested = grpcclient.InferRequestedOutput(OUTPUT)
        requested.set_shared_memory(self.names["out"], s.nbytes)
        self.client.infer(s.model, [infer_input], outputs=[requested])

    def close(self) -> None:
        client = getattr(self, "client", None)
        try:
            for name in getattr(self, "registered", ()):
                self.unregister_region(client, name)
        finally:
            for handle in getattr(self, "handles", {}).values():
                self.destroy_region(handle)
            if client is not None:
                client.close()


class TritonclientShm(TwoRegions):
    name = "tc-shm"
    group = "peer"
    description = ("tritonclient.utils.shared_memory: an input and an output region made and registered "
                   "once; per request set_shared_memory_region in, get_contents_as_numpy(...).copy() out")
    tag = "tc-bench"

    def create_region(self, name: str) -> Any:
        import tritonclient.utils.shared_memory as tcshm

        return tcshm.create_shared_memory_region(name, "/" + name, self.setting.nbytes)

    def register_region(self, client: Any, name: str, handle: Any) -> None:
        client.register_system_shared_memory(name, "/" + name, self.setting.nbytes)

    def unregister_region(self, client: Any, name: str) -> None:
        client.unregister_system_shared_memory(name)

    def destroy_region(self, handle: Any) -> None:
        import tritonclient.utils.shared_memory as tcshm

        tcshm.destroy_shared_memory_region(handle)

    def call(self, x: np.ndarray) -> np.ndarray:
        # get_contents_as_numpy is a view the next request overwrites: a
        # user who keeps the result copies it, as Client.infer does.
        return self.host_call(x).copy()

    def host_call(self, x: np.ndarray) -> np.ndarray:
        """The per-request work on host arrays: *x* into the input region, the output region's
        contents out as a view (the next request overwrites it)."""
        import tritonclient.utils.shared_memory as tcshm

        s = self.setting
        tcshm.set_shared_memory_region(self.handles["in"], [x])
        self.infer()
        return tcshm.get_contents_as_numpy(self.handles["out"], s.dtype, [s.count])


class TritonShmClient(Method):
    """triton-shm-client (PyPI), measured only where it is installed.

    Its ``register_shm_model`` takes per-sample shapes under a batch
    dimension of at most ``max_batch_size``.  The identity models do not
    batch and have one variable dimension, so that dimension is the
    client's batch: each element is a sample of shape ``()`` and
    ``max_batch_size`` is the element count, which makes ``infer_shm`` send
    exactly one request of shape ``[count]``.  ``infer_shm`` copies the
    input into its slot and the output into a fresh array, like
    ``Client.infer``.
    """

    name = "triton-shm-client"
    group = "peer"
    description = "triton-shm-client's TritonSHMClient.infer_shm (pool of one slot), if installed"

    @classmethod
    def missing(cls) -> str | None:
        if importlib.util.find_spec("triton_shm_client") is None:
            return "not installed"
        return None

    def open(self) -> None:
        from triton_shm_client import TritonSHMClient

        s = self.setting
        self.client = TritonSHMClient(s.require_grpc())
        self.client.register_shm_model(
            s.model, inputs=[(INPUT, (), s.dtype)], outputs=[(OUTPUT, (), s.dtype)],
            max_batch_size=s.count, pool_size=1,
        )

    def call(self, x: np.ndarray) -> np.ndarray:
        return self.client.infer_shm(self.setting.model, {INPUT: x})[OUTPUT]


class ClientInfer(Method):
    name = "Client.infer"
    group = "tritonshm"
    description = "tritonshm.Client(url, transport='shm').infer(model, {name: x}): copy in, copy out (copy=True)"
    http = False  #: the client made with the server's http:// URL, not its gRPC one

    def open(self) -> None:
        from ..client import Client

        self.client = Client(self.setting.client_url(self.http), transport="shm")

    def call(self, x: np.ndarray) -> np.ndarray:
        return self.client.infer(self.setting.model, {INPUT: x})[OUTPUT]


class ClientInferHttp(ClientInfer):
    name = "Client.infer-http"
    description = "the same Client.infer, the client made with the server's http:// URL"
    http = True


class Facade(Method):
    """tritonclient's API via tritonshm: the ``grpc`` peer's very code -- ``InferInput``,
    ``set_data_from_numpy``, ``infer``, ``as_numpy`` -- with ``tritonshm.grpc`` imported in place
    of ``tritonclient.grpc``, so the tensors go through the facade client's slot pools.  The
    first call registers the slots (untimed: the warm-up rounds)."""

    name = "tritonshm.grpc"
    group = "tritonshm"
    description = ("tritonclient API via tritonshm: the grpc row's code with `import tritonshm.grpc` in place of "
                   "tritonclient.grpc (set_data_from_numpy, infer, as_numpy; the tensors through its slots, "
                   "inline below its tritonshm_inline_bytes, 128 KiB over gRPC)")
    protocol = "grpc"  #: which facade module, and which of the server's addresses

    def open(self) -> None:
        import importlib

        self.module = importlib.import_module(f"tritonshm.{self.protocol}")
        self.http = self.protocol == "http"
        self.client = self.module.InferenceServerClient(self.setting.require_http() if self.http
                                                       else self.setting.require_grpc())

    def call(self, x: np.ndarray) -> np.ndarray:
        # As Setting.wire_args makes the plain rows' request, with the facade's module.
        s = self.setting
        infer_input = self.module.InferInput(INPUT, [s.count], s.datatype)
        infer_input.set_data_from_numpy(x)
        requested = (self.module.InferRequestedOutput(OUTPUT, binary_data=True) if self.http
                     else self.module.InferRequestedOutput(OUTPUT))
        return self.client.infer(s.model, [infer_input], outputs=[requested]).as_numpy(OUTPUT)


class FacadeHttp(Facade):
    name = "tritonshm.http"
    description = "the same with `import tritonshm.http` in place of tritonclient.http (the http row's code)"
    protocol = "http"


class ZeroCopy(ClientInfer):
    name = "zero-copy"
    group = "tritonshm"
    description = ("tritonshm.Client.request(): np.copyto(req.inputs[name], x), req.run(), "
                   "the output read as a view of the slot (no copy out)")

    def call(self, x: np.ndarray) -> np.ndarray:
        s = self.setting
        with self.client.request(s.model, shapes={INPUT: (s.count,)}) as request:
            np.copyto(request.inputs[INPUT], x)
            return request.run()[OUTPUT]  # the view holds the slot until the caller drops it


class ZeroCopyHttp(ZeroCopy):
    name = "zero-copy-http"
    description = "the same zero-copy request, the client made with the server's http:// URL"
    http = True


class Floor(Method):
    name = "floor"
    group = "reference"
    description = ("inputs already in a registered tritonshm.SystemRegion, bound by hand with "
                   "bind_input/bind_output, outputs left there: tritonclient.grpc's infer call alone")
    wire: Transport = GRPC  #: which tritonclient flavour makes the call

    def open(self) -> None:
        from .. import triton
        from .._memory import SystemRegion

        s = self.setting
        address = s.require_http() if self.wire.http else s.require_grpc()
        self.client = self.wire.connect(address)
        out_offset = _page_round(s.nbytes)
        self.region = SystemRegion.create(out_offset + s.nbytes)
        self.name_registered = triton.register(self.client, self.region)
        self.input = self.wire.infer_input(INPUT, [s.count], s.datatype)
        triton.bind_input(self.input, self.region, 0)
        self.output = self.wire.requested_output(OUTPUT)
        triton.bind_output(self.output, self.region, out_offset, s.nbytes)
        self.in_view = self.region.ndarray(s.dtype, (s.count,), 0)
        self.out_view = self.region.ndarray(s.dtype, (s.count,), out_offset)
        self.staged: np.ndarray | None = None

    def stage(self, x: np.ndarray) -> None:
        if x is not self.staged:
            np.copyto(self.in_view, x)
            self.staged = x

    def call(self, x: np.ndarray) -> np.ndarray:
        self.client.infer(self.setting.model, [self.input], outputs=[self.output])
        return self.out_view

    def close(self) -> None:
        from .. import triton

        self.in_view = self.out_view = self.staged = None
        client = getattr(self, "client", None)
        region = getattr(self, "region", None)
        try:
            if getattr(self, "name_registered", None):
                triton.unregister(client, self.name_registered)
        finally:
            if region is not None:
                region.close()
            if client is not None:
                client.close()


class FloorHttp(Floor):
    """The floor over HTTP: the HTTP rows' own protocol's cost of one request, for their limit."""

    name = "floor-http"
    description = "the same floor over HTTP: tritonclient.http's infer call alone, inputs and outputs in the region"
    wire = HTTP


class Memcpy(Method):
    name = "memcpy"
    group = "reference"
    description = "np.copyto of the input into a preallocated array: one copy of the input's bytes"

    def open(self) -> None:
        self.target = np.empty(self.setting.count, self.setting.dtype)
        self.target.fill(0)  # touch the pages now, not in the first timed call

    def call(self, x: np.ndarray) -> np.ndarray:
        np.copyto(self.target, x)
        return self.target


#: Every method, in the order of the table.
METHODS: tuple[type[Method], ...] = (Grpc, Http, TritonclientShm, TritonShmClient, ClientInfer, ClientInferHttp,
                                     Facade, FacadeHttp, ZeroCopy, ZeroCopyHttp, Floor, FloorHttp, Memcpy)

#: The methods tritonshm is compared against; the best of them is the "best peer".
PEERS = tuple(m.name for m in METHODS if m.group == "peer")

#: Each protocol's limit, floor + memcpy sample by sample (all three run in every repetition):
#: name -> the methods it adds up.  The gRPC floor is tritonclient.grpc's call, the HTTP one
#: tritonclient.http's: each protocol's rows are measured against their own protocol's limit.
LIMITS: dict[str, tuple[str, str]] = {"limit": ("floor", "memcpy"), "limit-http": ("floor-http", "memcpy")}
#: The gRPC limit, and what it adds up (the name the JSON's ``meta.limit`` describes).
LIMIT = "limit"
LIMIT_PARTS = LIMITS[LIMIT]

#: The methods whose time is also given as a multiple of a limit, and which limit: their protocol's.
AGAINST_LIMIT: dict[str, str] = {
    "Client.infer": "limit", "Client.infer-http": "limit-http", "tritonshm.grpc": "limit",
    "tritonshm.http": "limit-http", "zero-copy": "limit", "zero-copy-http": "limit-http",
}
