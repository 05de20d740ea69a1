"""Run a script as ``python SCRIPT ARGS...`` would, and report what tritonshm's clients carried.

    python facade_runner.py REPORT.json SCRIPT [ARGS...]

Test-only (tests/examples/test_tritonclient_examples.py).  The facade (``tritonshm.grpc``,
``tritonshm.http`` and their ``.aio``) hands every call its slots take to the
:class:`tritonshm.Client` (:class:`tritonshm.aio.Client` for the aio modules) it holds: a call
through that client's ``infer`` (``infer_async`` runs ``infer`` on a worker thread), a stream's
request through its ``_stream_to`` (the one private name, reached through
tests/support/insides.py).  Before the script runs, this wraps those, and two more public methods
of the two public classes:

- ``infer``, ``stream`` and ``_stream_to``: count the calls, by model;
- ``close``: takes a snapshot of ``pools()`` first (what the client had registered with the
  server, and in which memory), as the client is about to give it up;
- ``__init__``: keeps the client, so that one the script never closed is looked at (``pools()``)
  when the script is done -- before the interpreter's exit releases it.

Then it runs SCRIPT in ``__main__`` (``sys.argv`` and ``sys.path[0]`` as Python sets them), and
writes REPORT.json whatever way the script ended (``sys.exit`` included)::

    {"calls": {"simple": 2}, "pools": [["simple", "system", ["tritonshm-..."]]]}

Nothing of this is in the library: the script's process is the only one patched.
"""

from __future__ import annotations

import collections
import functools
import json
import os
import runpy
import sys

import tritonshm
import tritonshm.aio

_HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(_HERE))  # tests/, for support/
from support.insides import count_stream_sends  # noqa: E402

calls: collections.Counter = collections.Counter()
pools: list[list] = []
made: list = []
looked_at: set[int] = set()


def _look(client) -> None:
    """Note what *client* holds now (once per client)."""
    if id(client) in looked_at:
        return
    looked_at.add(id(client))
    for pool in client.pools():
        pools.append([pool.model, pool.memory, list(pool.regions)])


def _wrap(cls) -> None:
    init, close = cls.__init__, cls.close

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        made.append(self)

    def counted(method):
        @functools.wraps(method)
        def call(self, model, *args, **kwargs):
            calls[model] += 1
            return method(self, model, *args, **kwargs)
        return call

    if cls is tritonshm.aio.Client:
        @functools.wraps(close)
        async def looked_close(self, **options):
            _look(self)
            await close(self, **options)
    else:
        @functools.wraps(close)
        def looked_close(self, **options):
            _look(self)
            close(self, **options)

    cls.__init__, cls.infer, cls.stream, cls.close = __init__, counted(cls.infer), counted(cls.stream), looked_close
    count_stream_sends(cls, lambda model: calls.update([model]))


def _every_call_through_the_slots() -> None:
    """The example scripts' tensors are tiny (64 B): over gRPC the facade would send them inline,
    as tritonclient does (faster there: ``tritonshm_inline_bytes``).  The scripts are here to
    show what the slots carry, so every call goes through them: the setting's own public knob,
    on the classes, in this process only."""
    import tritonshm.grpc
    import tritonshm.grpc.aio

    for facade in (tritonshm.grpc.InferenceServerClient, tritonshm.grpc.aio.InferenceServerClient):
        facade.tritonshm_inline_bytes = 0


def main() -> None:
    report, script, *args = sys.argv[1:]
    _wrap(tritonshm.Client)
    _wrap(tritonshm.aio.Client)
    _every_call_through_the_slots()
    sys.argv = [script, *args]
    # As Python sets it for `python SCRIPT`: the script's folder first, neither of ours.
    sys.path[:] = [os.path.dirname(os.path.abspath(script)),
                   *(p for p in sys.path if p not in (_HERE, os.path.dirname(_HERE)))]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        for client in made:
            _look(client)
        with open(report, "w") as out:
            json.dump({"calls": dict(calls), "pools": pools}, out)


if __name__ == "__main__":
    main()
