"""The timing the Python benchmarks share: a call's median wall time after a warm-up."""

from __future__ import annotations

import statistics
import time
from typing import Callable


def median_s(fn: Callable[[], object], reps: int) -> float:
    """Seconds: the median of `reps` calls of fn after one more (the warm-up: allocation, first-call
    work, compilation) that is not counted."""
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)
