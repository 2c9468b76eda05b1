"""Statistics over repeated runs (seeds), as pure functions: the mean with a Student t 95% interval, the mean with a
percentile-bootstrap interval and the median, the paired difference of two methods on the same seeds with its
interval and a two-sided paired t-test; one run's measurement noise on a finite item set (is a run distinguishable
from the backbone?) and the Pareto front of two scores.

Student t: mean ± t(0.975, n-1) * s / sqrt(n) with s the sample standard deviation; it serves the paired
differences (a difference whose interval covers 0 is reported as "indistinguishable"). A score's own interval is the
percentile bootstrap over seeds (`bootstrap`): the 2.5th and 97.5th percentiles of the means of resamples drawn with
replacement, which lie between the smallest and the largest seed's value and so inside the score's range [0, 100];
a t interval over seeds that split into two modes (some at the backbone, some converged) crosses 100. It is seeded
and deterministic. No scipy: the t distribution's CDF is the regularized incomplete beta function (continued
fraction, Numerical Recipes' `betacf` scheme) and its quantile is found by bisection.
"""

from __future__ import annotations

import math
import statistics

CONFIDENCE = 0.95


def _betacf(a: float, b: float, x: float) -> float:
    """The continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 1e-15
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1) / (a + b + 2):
        return math.exp(log_front) * _betacf(a, b, x) / a
    return 1 - math.exp(log_front) * _betacf(b, a, 1 - x) / b


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with df degrees of freedom."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return 1 - tail if t >= 0 else tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p (bisection; |t| < 1e4 covers df >= 1 at p = 0.9995)."""
    low, high = -1e4, 1e4
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2


def interval(values: list[float], confidence: float = CONFIDENCE) -> dict:
    """mean, sample std, n and the Student t interval [low, high] (None for fewer than two values)."""
    values = [float(v) for v in values]
    n = len(values)
    mean = statistics.fmean(values)
    if n < 2:
        return {"mean": mean, "std": 0.0, "n": n, "low": None, "high": None}
    std = statistics.stdev(values)
    half = t_quantile(0.5 + confidence / 2, n - 1) * std / math.sqrt(n)
    return {"mean": mean, "std": std, "n": n, "low": mean - half, "high": mean + half}


BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0


def bootstrap(values: list[float], confidence: float = CONFIDENCE, resamples: int = BOOTSTRAP_RESAMPLES,
              seed: int = BOOTSTRAP_SEED) -> dict:
    """mean, median, sample std, n and the percentile-bootstrap interval of the mean [low, high]: `resamples` draws of
    n values with replacement (numpy's generator seeded with `seed`, so the same values give the same interval), the
    (1 - confidence) / 2 and (1 + confidence) / 2 quantiles of their means (numpy's linear interpolation); None for
    fewer than two values."""
    import numpy as np

    values = [float(v) for v in values]
    result = {**interval(values, confidence), "median": statistics.median(values), "interval": "percentile bootstrap"}
    if len(values) < 2:
        return result
    array = np.asarray(values)
    means = array[np.random.default_rng(seed).integers(0, len(values), (resamples, len(values)))].mean(axis=1)
    low, high = np.quantile(means, [(1 - confidence) / 2, (1 + confidence) / 2])
    # the quantile of a mean of values in [min, max] lies there too; float rounding may not, so say it exactly
    return {**result, "low": min(max(float(low), min(values)), max(values)),
            "high": min(max(float(high), min(values)), max(values))}


def paired_difference(a: dict, b: dict, confidence: float = CONFIDENCE) -> dict:
    """a - b on the seeds both have ({seed: value}): the mean difference with its t interval, and the two-sided
    paired t-test's p-value; verdict "indistinguishable" where the interval covers 0 (or has no width to judge)."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError("no seed in common")
    differences = [a[s] - b[s] for s in seeds]
    result = {**interval(differences, confidence), "seeds": seeds}
    if result["low"] is None:
        return {**result, "p": None, "verdict": "indistinguishable"}
    if result["std"] == 0:
        p = 1.0 if result["mean"] == 0 else 0.0
    else:
        t = result["mean"] / (result["std"] / math.sqrt(len(seeds)))
        p = 2 * (1 - t_cdf(abs(t), len(seeds) - 1))
    covers = result["low"] <= 0 <= result["high"]
    verdict = "indistinguishable" if covers else ("first higher" if result["mean"] > 0 else "second higher")
    return {**result, "p": p, "verdict": verdict}


def proportion_noise(percent: float, n: int) -> float:
    """One run's measurement noise, in points, of a score in % over n items: the binomial standard error at that
    score, sqrt(p (1 - p) / n), and at least one item's worth (100 / n), since at 0 or 100% the binomial error
    vanishes and yet one answer changing is not a model that moved."""
    if n < 1:
        raise ValueError(f"a score over {n} items has no noise to speak of")
    p = min(max(percent / 100, 0.0), 1.0)
    return 100 * max(math.sqrt(p * (1 - p) / n), 1 / n)


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """The indexes of the points that no other point beats on both axes (at least as high on both and higher on
    one), ordered by the first axis then the second: the frontier through the best. Equal points are all kept."""
    front = [i for i, (x, y) in enumerate(points)
             if not any(a >= x and b >= y and (a > x or b > y) for a, b in points)]
    return sorted(front, key=lambda i: points[i])


def mann_whitney(a: list[float], b: list[float]) -> dict:
    """The two-sided Mann-Whitney U test of two independent samples (do the values of `a` tend to be higher than
    those of `b`?): U = the pairs (x in a, y in b) with x > y, ties counting a half, and its exact p-value, the share
    of the C(n, len(a)) ways of splitting the pooled values (midranks for ties) whose U lies as far from its mean
    n_a n_b / 2 as the observed one. Exact by enumeration, so for small samples only (a study's sweep seeds against
    its final seeds: C(13, 3) = 286 splits)."""
    from itertools import combinations

    if not a or not b:
        raise ValueError("two non-empty samples")
    pooled = sorted(a + b)
    rank = {v: (pooled.index(v) + 1 + len(pooled) - pooled[::-1].index(v)) / 2 for v in pooled}  # midranks
    ranks = [rank[v] for v in a + b]
    offset = len(a) * (len(a) + 1) / 2

    def u(chosen) -> float:
        return sum(ranks[i] for i in chosen) - offset

    observed, centre = u(range(len(a))), len(a) * len(b) / 2
    splits = list(combinations(range(len(ranks)), len(a)))
    if len(splits) > 200_000:
        raise ValueError(f"{len(splits)} splits: too many to enumerate")
    extreme = sum(abs(u(s) - centre) >= abs(observed - centre) - 1e-9 for s in splits)
    return {"u": observed, "n_a": len(a), "n_b": len(b), "p": extreme / len(splits)}
