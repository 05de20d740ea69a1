"""Timing for ``tritonshm demo`` (``tritonshm bench`` has its own interleaved harness)."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_seconds(run: Callable[[], None], seconds: float, min_runs: int = 5) -> float:
    """Median seconds per call of *run*, calling it for about *seconds*.

    One warm-up call first: first-use costs (connections, pool creation,
    registration) are not per-request costs.
    """
    run()
    times: list[float] = []
    deadline = time.perf_counter() + seconds
    while len(times) < min_runs or time.perf_counter() < deadline:
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)
