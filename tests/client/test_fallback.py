"""The transport state machine (client/_fallback.py), step by step, without a server -- as h11
tests its ConnectionState: every transport, every refusal, in order, and what each answers."""

from __future__ import annotations

import threading

import pytest

from tritonshm.client._fallback import Fallback, Next, Step


def test_auto_steps_down_once_each_way_with_one_warning_per_step():
    state = Fallback("auto", "gRPC")
    assert (state.wire, state.cuda_refused, state.lending_refused, state.describe()) == (False, None, None, "auto")
    first = state.refused(on_gpu=True, why="no CUDA IPC")
    assert first == Step(Next.HOST, "tritonshm: GPU tensors fall back to pinned system shared memory: no CUDA IPC")
    assert state.cuda_refused == "no CUDA IPC" and state.lending_refused == "no CUDA IPC"  # nor lent tensors
    assert state.refused(on_gpu=True, why="again") == Step(Next.HOST)  # taken already: no second warning
    assert state.cuda_refused == "no CUDA IPC" and not state.wire
    host = state.refused(on_gpu=False, why="cannot open /dev/shm/x")
    assert host == Step(Next.WIRE, "tritonshm: falling back to plain gRPC: cannot open /dev/shm/x")
    assert state.wire and state.describe() == "wire"
    assert state.refused(on_gpu=False, why="again") == Step(Next.WIRE)


def test_auto_may_go_to_the_wire_first_and_says_its_protocol():
    state = Fallback("auto", "HTTP")
    assert state.refused(on_gpu=False, why="x") == Step(Next.WIRE, "tritonshm: falling back to plain HTTP: x")
    assert state.wire and state.cuda_refused is None


@pytest.mark.parametrize("transport, on_gpu, expected", [
    ("shm", False, Next.RAISE),      # shm never leaves shared memory
    ("shm", True, Next.HOST),        # ... but GPU tensors may use host slots (a pinned pool)
    ("cuda", True, Next.RAISE),      # cuda never leaves CUDA memory
    ("cuda", False, Next.RAISE),
    ("auto", True, Next.HOST),
    ("auto", False, Next.WIRE),
])
def test_what_each_transport_allows(transport, on_gpu, expected):
    state = Fallback(transport, "gRPC")
    step = state.refused(on_gpu=on_gpu, why="refused")
    assert step.next is expected
    if expected is Next.RAISE:  # a refusal raised changes nothing
        assert step.warning is None and (state.wire, state.cuda_refused, state.lending_refused) == (False, None, None)


@pytest.mark.parametrize("on_gpu", [True, False])
def test_a_caller_who_asked_for_one_kind_of_memory_gets_the_refusal(on_gpu):
    state = Fallback("auto", "gRPC")
    assert state.refused(on_gpu=on_gpu, why="refused", strict=True) == Step(Next.RAISE)
    assert (state.wire, state.cuda_refused) == (False, None)


def test_wire_starts_at_the_wire():
    state = Fallback("wire", "gRPC")
    assert state.wire and state.describe() == "wire"


def test_a_refused_lent_allocation_ends_lending_only_quietly():
    state = Fallback("cuda", "gRPC")
    state.lending_refused_because("cannot open this allocation")
    state.lending_refused_because("a second one")  # the first reason stays
    assert state.lending_refused == "cannot open this allocation"
    assert state.cuda_refused is None and not state.wire  # CUDA slots may still work: they are tried


def test_concurrent_first_refusals_warn_once():
    state = Fallback("auto", "gRPC")
    barrier = threading.Barrier(8)
    steps = []

    def refuse():
        barrier.wait()
        steps.append(state.refused(on_gpu=False, why="x"))

    threads = [threading.Thread(target=refuse) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [step.next for step in steps] == [Next.WIRE] * 8
    assert sum(step.warning is not None for step in steps) == 1


def test_nothing_but_the_fallback_writes_its_state():
    """One writer: no module of the package assigns the fallback's attributes but _fallback.py."""
    import ast
    from pathlib import Path

    import tritonshm

    state = {"wire", "cuda_refused", "lending_refused"}
    writers = []
    for path in Path(tritonshm.__file__).parent.rglob("*.py"):
        if path.name == "_fallback.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                owner = getattr(target, "value", None)  # what the attribute is set on: a fallback?
                named = owner.attr if isinstance(owner, ast.Attribute) else getattr(owner, "id", "")
                if isinstance(target, ast.Attribute) and target.attr in state and "fallback" in named.lower():
                    writers.append(f"{path.name}:{node.lineno} {named}.{target.attr}")
    assert writers == []
