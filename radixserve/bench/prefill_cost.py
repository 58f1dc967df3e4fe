"""The prefill cost model behind the ideal cache ratio: t(n) = c0 + a*n + b*n^2.

t(n) is the latency of a one-token request (max_new_tokens=1) with an n-token prompt on the
no-cache runtime. A cached prefix of c tokens saves what prefilling those c tokens on their own
costs, less the per-request cost c0 (the request still runs): ``a*c + b*c^2``. Causal attention
makes that exact: a prompt's first c tokens attend only to each other.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

NUM_LENGTHS = 4
MIN_LONGEST = 32


def calibration_lengths(max_cached: int) -> list[int]:
    """NUM_LENGTHS distinct prompt lengths from about 1/8 of to the longest cached prefix (at
    least MIN_LONGEST tokens): ``top / 8`` steps ``7 * top / 24 >= 9`` apart, never merged."""
    top = max(max_cached, MIN_LONGEST)
    return [round(x) for x in np.linspace(top / 8, top, NUM_LENGTHS)]


def fit_prefill_cost(lengths: Sequence[int], times_s: Sequence[float]) -> dict[str, Any]:
    """Least-squares t(n) = c0 + a*n + b*n^2. Noise can bend it: b < 0 or a < 0 falls back to
    a line (b = 0), and a line with a <= 0 to the average cost per token at the longest length.
    Returns the coefficients (seconds; ``a`` per token, ``b`` per token squared) and which fit
    was used (``quadratic``, ``linear`` or ``average``)."""
    n = np.asarray(lengths, dtype=np.float64)
    t = np.asarray(times_s, dtype=np.float64)
    b, a, c0 = (float(v) for v in np.polyfit(n, t, 2))
    fit = "quadratic"
    if b < 0 or a < 0:
        a, c0 = (float(v) for v in np.polyfit(n, t, 1))
        b, fit = 0.0, "linear"
    if a <= 0:
        longest = int(np.argmax(n))
        a, c0, fit = float(t[longest] / n[longest]), 0.0, "average"
    return {"fit": fit, "c0_s": c0, "a_s_per_token": a, "b_s_per_token2": b}


def saved_prefill_s(cached_per_request: Sequence[int], calibration: dict[str, Any]) -> float:
    """Prefill time an ideal cache saves: sum over requests of a*c + b*c^2 (c0 is not saved)."""
    a, b = calibration["a_s_per_token"], calibration["b_s_per_token2"]
    return float(sum(a * c + b * c * c for c in cached_per_request))


def merge_calibrations(calibrations: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One calibration from several (one after each no-cache run with ``--repeat``): the
    fastest time seen at each length, refitted. A shared host only ever adds time, and taking
    the minimum over calibrations spread across the runs matches the fastest run it is set
    against."""
    best: dict[int, float] = {}
    for cal in calibrations:
        for n, t in zip(cal["lengths"], cal["best_s"], strict=True):
            best[n] = min(t, best.get(n, t))
    lengths = sorted(best)
    times = [best[n] for n in lengths]
    merged = {"lengths": lengths, "best_s": times, **fit_prefill_cost(lengths, times)}
    merged["num_calibrations"] = len(calibrations)
    return merged
