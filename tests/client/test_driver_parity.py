"""The blocking and the asyncio client are two drivers of one engine (as pyzmq's sockets, as
httpcore's sync and async halves): nothing either may have that the other lacks.  In the spirit
of httpcore's ``unasync --check``: both handler tables carry out every step type, and the two
clients' public calls are the same apart from ``async``."""

from __future__ import annotations

import inspect

import pytest

import tritonshm
import tritonshm.aio
from tritonshm.client import _steps
from tritonshm.client._aio import AsyncDriver
from tritonshm.client._client import BlockingDriver
from tritonshm.client._engine import Engine

#: Steps only the blocking driver's iterate() / the aio driver's iterate() take apart from their tables.
_NOT_IN_TABLES = {_steps.Emit, _steps.Done}


def step_types():
    return {getattr(_steps, name) for name in _steps.__all__ if inspect.isclass(getattr(_steps, name))} \
        - _NOT_IN_TABLES


def handlers_of(driver_class, aio):
    engine = Engine("localhost:1", aio=aio)
    if aio:
        return driver_class(engine, None).handlers
    return driver_class(engine, None).handlers


def test_both_handler_tables_carry_out_every_step_type():
    blocking = set(handlers_of(BlockingDriver, aio=False))
    asyncio_ = set(handlers_of(AsyncDriver, aio=True))
    assert blocking == step_types(), "the blocking driver's table"
    assert asyncio_ == step_types(), "the aio driver's table"


def public(cls):
    return {name: member for name, member in inspect.getmembers(cls)
            if not name.startswith("_") or name in ("__init__",)}


def shape(function):
    return [(p.name, p.kind, p.default) for p in inspect.signature(function).parameters.values()]


#: What only the blocking client has, and why: an aio call already does not block the caller.
_BLOCKING_ONLY = {"infer_async"}


@pytest.mark.parametrize("name", sorted(set(public(tritonshm.Client)) - _BLOCKING_ONLY))
def test_the_aio_client_has_each_public_call_of_the_blocking_one_with_its_signature(name):
    blocking, aio = public(tritonshm.Client), public(tritonshm.aio.Client)
    assert name in aio, f"tritonshm.aio.Client has no {name}"
    ours, theirs = blocking[name], aio[name]
    if isinstance(inspect.getattr_static(tritonshm.Client, name), property):
        assert isinstance(inspect.getattr_static(tritonshm.aio.Client, name), property), name
        return
    assert shape(ours) == shape(theirs), name


def test_the_aio_client_has_no_public_call_the_blocking_one_lacks():
    extra = set(public(tritonshm.aio.Client)) - set(public(tritonshm.Client))
    assert extra == set(), extra
