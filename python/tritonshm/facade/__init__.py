"""tritonclient's API over tritonshm's slot pools: what :mod:`tritonshm.grpc`, :mod:`tritonshm.http`
and their ``.aio`` are made of, and which part is whose.

Nothing here is for users to import.  They change one import line
(``import tritonshm.grpc as grpcclient``, was ``import tritonclient.grpc as grpcclient``) and
keep their code, so tritonclient's API stays at the names tritonclient's users know:

**tritonclient's: the public modules** (``python/tritonshm/grpc/``, ``python/tritonshm/http/``,
each with its ``aio.py``).  Every public name of tritonclient's module, the very same object
(``InferRequestedOutput``, ``InferResult``, ``InferenceServerException``, ...), but two classes
that extend tritonclient's own: ``InferenceServerClient``, whose constructor and every method are
tritonclient's, with tritonclient's signatures, and whose ``infer`` / ``async_infer`` (gRPC: the
stream's methods too) hand the call to the route below and, where it declines, to tritonclient's
own method; and ``InferInput``, whose ``set_data_from_numpy`` keeps the array (copied once, into a
slot).  A class defined there is named as the user imports it
(``tritonshm.grpc.InferenceServerClient``): in reprs, tracebacks and the API reference.

**Ours: this package**, the slot routing behind those classes, bottom up (each module imports
only those above it, and nothing here imports the public modules: checked by
tests/client/test_package_layers.py):

===========  ==============================================================================
``_route``   :class:`~tritonshm.facade._route.SlotRoute`: a tritonclient call carried through
             the slot pools of a held :class:`tritonshm.Client` (:class:`tritonshm.aio.Client`
             for the aio modules), made on the first call that uses them; the one plan that
             decides which calls the slots can carry exactly as tritonclient sends them;
             results (``SlotResult``) and errors (``in_tritonclients_words``) answered as
             tritonclient's; what ``verbose=True`` prints (``Told``); the ``InferInput`` mixin
             (``KeptInput``); the clients' shared base (``HeldSlots``, ``AioHeldSlots``)
``_stream``  tritonclient.grpc's inference stream (``start_stream`` / ``async_stream_infer`` /
             ``stop_stream``, the aio ``stream_infer``) with each request's inputs in a slot
===========  ==============================================================================

Below it: :mod:`tritonshm.client` (the held client, its stream table),
``tritonshm._tritonclient_compat`` (every private name of tritonclient used, checked against the
installed release) and :mod:`tritonshm.errors`.
"""
