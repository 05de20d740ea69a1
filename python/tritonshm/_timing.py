"""Timing for ``tritonshm demo`` (``tritonshm bench`` has its own interleaved harness)."""

from __future__ import annotations

import statistics
import time
from typing import Callable, Mapping


def interleaved_medians(runs: Mapping[str, Callable[[], None]], seconds: float, rounds: int = 5,
                        min_runs: int = 3) -> dict[str, float]:
    """Median seconds per call of each of *runs*, about *seconds* in all: *rounds* rounds, each
    giving every run its share in turn (the order rotating), so a shared machine's noise falls
    on all alike.  One warm-up call of each first."""
    for run in runs.values():
        run()
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    share = seconds / rounds / max(len(names), 1)
    for index in range(rounds):
        shift = index % len(names)
        for name in names[shift:] + names[:shift]:
            run, kept = runs[name], times[name]
            deadline, done = time.perf_counter() + share, 0
            while done < min_runs or time.perf_counter() < deadline:
                start = time.perf_counter()
                run()
                kept.append(time.perf_counter() - start)
                done += 1
    return {name: statistics.median(kept) for name, kept in times.items()}
