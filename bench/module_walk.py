#!/usr/bin/env python3
"""Follow one tensor through ``Client.infer`` and count how often the call crosses a module.

Issue 33's measure of the client's shape: a warm call (the model known, its pool made, the
request seen before) traced with ``sys.setprofile``; every call from one tritonshm module
into another is a crossing, and a crossing into a module the walk entered before is a
*re-entry*.  Four walks: the quick path (a request seen before), the same request with an
option (it travels with the request, planned once), the full path (results as views of the
slot, ``copy=False``, which the quick path does not take) and a cold call (a new client).

    python bench/module_walk.py --url localhost:8001          # a running server
    python bench/module_walk.py                               # starts a LocalServer

Prints, per walk: crossings, modules entered, re-entries, and the modules in the order entered.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import numpy as np


def _module_of(frame: Any) -> str | None:
    name = frame.f_globals.get("__name__", "")
    return name if name.startswith("tritonshm") else None


def walk(call: Any, trace: list[str] | None = None) -> tuple[int, int, int, list[str]]:
    """(crossings, modules entered, re-entries, modules in order) of one run of *call*; each
    crossing also appended to *trace*, where given ("caller > callee.function", re-entries marked)."""
    crossings = reentries = 0
    entered: list[str] = []
    stack: list[str | None] = []

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal crossings, reentries
        if event == "call":
            module = _module_of(frame)
            caller = stack[-1] if stack else None
            if module is not None and caller is not None and module != caller:
                crossings += 1
                again = module in entered
                reentries += again
                if trace is not None:
                    short = module.removeprefix("tritonshm.")
                    trace.append(f"{'  again ' if again else '        '}{caller.removeprefix('tritonshm.')} > "
                                 f"{short}.{frame.f_code.co_name}")
            if module is not None and module not in entered:
                entered.append(module)
            stack.append(module if module is not None else caller)
        elif event == "return" and stack:
            stack.pop()

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return crossings, len(entered), reentries, entered


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", help="a running server's gRPC address (default: start one)")
    parser.add_argument("--size", type=int, default=4096, help="input bytes (default 4096)")
    parser.add_argument("--trace", action="store_true", help="also print every crossing of the warm walks")
    args = parser.parse_args()
    import tritonshm

    server = None
    url = args.url
    if url is None:
        from tritonshm.server import LocalServer

        server = LocalServer().start()
        url = server.grpc_url
    x = np.arange(args.size // 4, dtype=np.float32)
    try:
        with tritonshm.Client(url) as client:
            for _ in range(3):  # warm: the model known, the pool made, the request seen
                client.infer("identity_fp32", {"INPUT0": x})
                client.infer("identity_fp32", {"INPUT0": x}, priority=1)
                client.infer("identity_fp32", {"INPUT0": x}, copy=False)
            walks = {
                "quick path (warm)": lambda: client.infer("identity_fp32", {"INPUT0": x}),
                "an option (warm, priority=1)": lambda: client.infer("identity_fp32", {"INPUT0": x}, priority=1),
                "full path (warm, copy=False)": lambda: client.infer("identity_fp32", {"INPUT0": x}, copy=False),
            }
            traces: dict[str, list[str]] = {name: [] for name in walks}
            results = {name: walk(call, traces[name] if args.trace else None) for name, call in walks.items()}

        def cold() -> None:
            with tritonshm.Client(url) as fresh:
                fresh.infer("identity_fp32", {"INPUT0": x})

        results["cold (a new client, closed after)"] = walk(cold)
    finally:
        if server is not None:
            server.stop()
    for name, (crossings, modules, reentries, order) in results.items():
        print(f"{name}: {crossings} crossings, {modules} modules, {reentries} re-entries")
        print("    " + " > ".join(module.removeprefix("tritonshm.") for module in order))
        if args.trace and name in traces:
            print("\n".join("    " + line for line in traces[name]))


if __name__ == "__main__":
    main()
