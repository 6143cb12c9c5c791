"""
The statistics of the studies, numpy only: censored times (Kaplan-Meier) and paired tests of a few seeds (t, exact
sign-flip, Holm, TOST).
Student's t is written out rather than taken from scipy.stats.t: the two agree to ~1e-14, not to the last bit, and
the committed summaries (assets/study*.json) rebuild byte for byte from these; tests/studies/test_stats.py checks both
against scipy where it is installed.
"""
import math

import numpy as np


# ----------------------------------------------------------------------------- censored times
def kaplan_meier(times, events):
    """Survival ('still on the plateau') after each distinct event step: [(step, S)], starting at (0, 1). times:
    the event step, or the last step of a censored run (events False): it leaves the risk set without an event."""
    times, events = np.asarray(times, float), np.asarray(events, bool)
    curve, s = [(0, 1.0)], 1.0
    for t in np.unique(times[events]):
        at_risk, d = (times >= t).sum(), (events & (times == t)).sum()
        s *= 1 - d / at_risk
        curve.append((int(t), float(s)))
    return curve


def km_median(curve):
    """The first step at which survival is <= 0.5; None: more than half still on the plateau at the end. The
    tolerance: a product of fractions that is exactly 0.5 can come out as 0.5000000000000001 in floating point."""
    return next((t for t, s in curve if s <= 0.5 + 1e-9), None)


def rmst(curve, cap):
    """Restricted mean steps to the criterion: the area under the survival curve up to the cap."""
    steps = [t for t, _ in curve if t < cap] + [cap]
    return float(sum((b - a) * s for (a, s), b in zip(curve, steps[1:])))


# ----------------------------------------------------------------------------- paired tests
def t_cdf(t, df):
    """Student's t distribution function, from the regularised incomplete beta function (a continued fraction,
    evaluated by the modified Lentz method): P(T <= t) with df degrees of freedom. Its absolute error grows near t = 0,
    where 1 - df / (df + t^2) cancels: ~1e-16 / t^2 (5e-14 at |t| = 0.1, 1e-8 at 1e-6: p-values close to 1)."""
    x, a, b = df / (df + t * t), df / 2, 0.5
    if x >= 1:
        return 0.5
    flip = x > (a + 1) / (a + b + 2)  # the continued fraction converges fast below this point: use the symmetry
    if flip:
        x, a, b = 1 - x, b, a
    front = np.exp(a * np.log(x) + b * np.log1p(-x) - np.log(a) - (math.lgamma(a) + math.lgamma(b)
                                                                    - math.lgamma(a + b)))
    f, c, d = 1.0, 1.0, 0.0
    for i in range(400):
        m = i // 2
        num = 1.0 if i == 0 else (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)) if i % 2 == 0 else
                                  -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)))
        d = 1.0 + num * d
        d = 1.0 / (d if abs(d) > 1e-300 else 1e-300)
        c = 1.0 + num / (c if abs(c) > 1e-300 else 1e-300)
        f *= c * d
        if abs(1.0 - c * d) < 1e-15:
            break
    tail = front * (f - 1.0) / 2  # I_x(a, b) / 2: P(T > |t|)
    tail = 0.5 - tail if flip else tail
    return 1.0 - tail if t > 0 else tail


def t_quantile(q, df):
    lo, hi = -1e3, 1e3
    for _ in range(200):  # bisection: t_cdf is monotone
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2


def paired_t(d, level=0.95):
    """Mean of the paired differences d, its two-sided t-interval at `level` and the two-sided p of mean = 0."""
    d = np.asarray(d, float)
    n, mean = len(d), float(d.mean())
    se = float(d.std(ddof=1)) / np.sqrt(n)
    if se == 0:
        return mean, (mean, mean), 0.0 if mean else 1.0
    h = t_quantile(1 - (1 - level) / 2, n - 1) * se
    return mean, (mean - h, mean + h), 2 * t_cdf(-abs(mean) / se, n - 1)


def sign_flip_p(d):
    """Exact two-sided sign-flip (permutation) test of paired differences: every one of the 2^n sign patterns is
    equally likely under no effect; p = the share whose |mean| is at least the observed. Its smallest value is
    2 / 2^n (0.0625 at n = 5)."""
    d = np.asarray(d, float)
    signs = 1 - 2 * ((np.arange(2 ** len(d))[:, None] >> np.arange(len(d))) & 1)
    return float(np.mean(np.abs(signs @ d) >= abs(d.sum()) - 1e-9))


def holm(ps):
    """Holm's step-down adjustment of m p-values: the k-th smallest times m - k + 1, kept monotone, at most 1."""
    order, out, running = np.argsort(ps, kind='stable'), [0.0] * len(ps), 0.0
    for k, i in enumerate(order):
        running = max(running, min(1.0, (len(ps) - k) * ps[i]))
        out[i] = running
    return out


def tost(d, margin):
    """Two one-sided t-tests of |mean| < margin: (the 90% t-interval, p = the larger one-sided p). Equivalence is
    shown at 5% when the interval lies inside (-margin, margin)."""
    d = np.asarray(d, float)
    mean, ci, _ = paired_t(d, 0.90)
    se = float(d.std(ddof=1)) / np.sqrt(len(d))
    p = max(1 - t_cdf((mean + margin) / se, len(d) - 1), t_cdf((mean - margin) / se, len(d) - 1)) if se else \
        float(abs(mean) >= margin)
    return ci, p


# ----------------------------------------------------------------------------- a trend
def line_fit(x, y, level=0.95):
    """The least-squares line y = a + b x: (a, b, the half-width of b's two-sided t-interval at `level`, n - 2 df).
    The half-width is None below 3 points (no residual left to measure the noise)."""
    x, y = np.asarray(x, float), np.asarray(y, float)
    xm, ym, sxx = x.mean(), y.mean(), float(((x - x.mean()) ** 2).sum())
    b = float(((x - xm) * (y - ym)).sum() / sxx)
    a = float(ym - b * xm)
    if len(x) < 3:
        return a, b, None
    se = math.sqrt(float(((y - a - b * x) ** 2).sum()) / (len(x) - 2) / sxx)
    return a, b, t_quantile(1 - (1 - level) / 2, len(x) - 2) * se
