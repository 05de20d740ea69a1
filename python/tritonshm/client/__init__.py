"""The high-level client (layer 5): pooled, zero-copy inference.

    with tritonshm.Client("localhost:8001") as c:      # "http://host:port" for HTTP
        out = c.infer("model", {"INPUT0": x})          # dict of numpy arrays (copies)

        with c.request("model", batch_size=8) as req:   # the zero-copy path
            req.inputs["INPUT0"][:] = x                 # numpy views into a slot
            out = req.run()                             # numpy views into the slot

How it works:

* **Discovery.**  The client reads each model's metadata and config once
  (names, datatypes, dims, ``max_batch_size``), so callers never declare
  shapes, and checks every input against it before anything is sent.
* **Slot pools.**  Per model, shared memory is registered once and carved
  into page-aligned slots, each holding a full batch of every input and
  output.  A request leases a slot, copies its inputs in once (BYTES
  inputs serialized straight into it) and names offsets in the request;
  nothing is registered or allocated per request.  When a request needs
  more room than the slots have (variable dims, long strings), a larger
  pool replaces the old one, which is retired once its slots come back.
* **Leases.**  A slot is a :class:`~tritonshm.Window` of the pool's region.
  It returns to the pool only when the window and every numpy view made
  from it are gone (``weakref.finalize`` on the window, whose views hold
  it), so results handed out with ``copy=False`` are never overwritten.
* **Held results never block.**  When every slot is out but some are only
  held by result views, the pool grows by another registered region
  (within ``max_pool_bytes``, the whole client's memory at every instant) instead of
  waiting; idle surplus goes back.
* **Backpressure.**  When requests in flight fill the pool, a request
  waits up to its slot_timeout, then raises :class:`~tritonshm.PoolExhausted`.
* **GPU tensors.**  Device inputs (CUDA Array Interface or DLPack) are
  sent by reference: the allocation holding each (a torch segment, a cupy
  chunk) is registered once and named in place, and held so that it is
  never freed under the server (:mod:`._lent`).  What cannot be shared
  goes through pools of CUDA slots with one device-to-device copy; results
  land where the inputs were, or where ``output_device`` says, or in the
  caller's own tensors (``out=``).  Where the server cannot open our CUDA
  memory, pinned host slots serve instead.
* **Chunking.**  A batch larger than ``max_batch_size`` is split, run on
  several slots at once and reassembled in order.
* **Self-healing.**  If the server lost our registrations (it restarted),
  the pool is registered again and the request retried once; if the server
  cannot open our memory, ``transport="auto"`` falls back to plain gRPC/HTTP
  with one warning.

The package, bottom up: each module imports only those above it (checked by
tests/client/test_package_layers.py):

==============  ==============================================================
``_model``      discovery: :class:`ModelInfo`, :class:`TensorSpec`
``_devices``    GPU inputs described without conversion; GPU results allocated
``_bytes``      the BYTES tensor codec (serialized straight into slots)
``_intake``     checking the caller's inputs; chunking; sizing slots
``_options``    :class:`RequestOptions`: tritonclient's per-request options, checked
``_slots``      the slot-memory interface: system, pinned and CUDA slots
``_steps``      the vocabulary of sans-I/O request steps
``_pool``       one slot pool: layout, extents, leases, growth
``_messages``   what goes on the wire for a request: a slot's request objects, ready messages
``_results``    what comes back: outputs read out of a slot or a reply, a batch's rows and join, ``out=``
``_fallback``   the transport state machine: what the server cannot open, and so how requests travel
``_plan``       :class:`Planner`: a call's checks, chunks and :class:`Route` -- its :class:`Plan`
``_stream``     streamed requests: one gRPC stream per client, responses by request id
``_disposal``   letting go of memory, the one way: unregister, park what is refused, close
``_lent``       the caller's GPU allocations lent to the server: a bounded table, held, let go
``_claim``      what one request holds while the server may touch it, and the one place it ends
``_pools``      the pool table: find, make, grow, retire, lease, the byte budget
``_engine``     :class:`Engine`: settings and state, lifecycle and requests in flight, discovery
``_run``        :class:`Runner`: every request's steps -- lend, lease, fill, send, heal; the quick path and its plans
``_face``       what both clients answer without I/O: settings, snapshots
``_request``    the zero-copy request's core both clients' ``Request`` hold
``_threads``    worker threads and connections of the blocking client
``_client``     :class:`Client` and :class:`Request`, holding an engine and the blocking driver
``_aio``        :class:`tritonshm.aio.Client`, holding an engine and the asyncio driver
==============  ==============================================================
"""

from ._client import Client, Request
from ._model import ModelInfo, TensorSpec
from ._lent import COPIED_WHY, LentInfo, LentStats
from ._options import RequestOptions
from ._pool import PoolInfo

__all__ = ["Client", "Request", "ModelInfo", "TensorSpec", "PoolInfo", "LentInfo", "LentStats", "COPIED_WHY",
           "RequestOptions"]
