"""studies/stats.py against answers worked out by hand, closed forms, and scipy.stats where it is installed (an
independent implementation: its t distribution, t-test, permutation test, Kaplan-Meier)."""
import itertools
import math

import numpy as np
import pytest

from studies import stats


# ----------------------------------------------------------------------------- censored times
def test_kaplan_meier_with_a_censored_run_and_ties():
    # 5 runs: events at 100, 200, 200, 400; one censored at 300 (it leaves the risk set without an event)
    curve = stats.kaplan_meier([100, 200, 200, 300, 400], [True, True, True, False, True])
    # by hand: 1 - 1/5 = 0.8; x (1 - 2/4) = 0.4; at 400 one run at risk, one event: 0
    assert curve == [(0, 1.0), (100, pytest.approx(0.8)), (200, pytest.approx(0.4)), (400, pytest.approx(0.0))]
    assert stats.km_median(curve) == 200
    assert stats.rmst(curve, 500) == pytest.approx(100 * 1.0 + 100 * 0.8 + 200 * 0.4 + 100 * 0.0)
    # censoring is not an event: the same numbers with 300 as an event give another curve
    assert stats.kaplan_meier([100, 200, 200, 300, 400], [True] * 5)[3] == (300, pytest.approx(0.2))


def test_km_median_at_exactly_half_despite_rounding():
    # 10 runs, a tie at 975: survival after the 5th event is 0.9 x 7/9 x 6/7 x 5/6 = 0.5 exactly, which floating
    # point gives as 0.5000000000000001; the median is still that step (the 5th of 10 sorted), not the next
    times = [850, 975, 975, 1150, 1175, 1550, 1700, 1725, 1875, 2125]
    curve = stats.kaplan_meier(times, [True] * 10)
    assert dict(curve)[1175] == pytest.approx(0.5)
    assert stats.km_median(curve) == 1175 == sorted(times)[4]


def test_kaplan_meier_all_censored_and_majority_censored():
    curve = stats.kaplan_meier([1500, 1500, 1500], [False, False, False])
    assert curve == [(0, 1.0)] and stats.km_median(curve) is None and stats.rmst(curve, 1500) == 1500
    curve = stats.kaplan_meier([800, 1500, 1500], [True, False, False])  # 2 of 3 still on the plateau at the cap
    assert stats.km_median(curve) is None and stats.rmst(curve, 1500) == pytest.approx(800 + 700 * 2 / 3)


def test_kaplan_meier_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    for _ in range(20):
        times = rng.choice(np.arange(1, 13) * 25, size=11)  # ties and censoring at shared steps
        events = rng.random(11) < 0.7
        events[0] = True
        sf = scipy_stats.ecdf(scipy_stats.CensoredData(uncensored=times[events], right=times[~events])).sf
        want = [(0, 1.0)] + [(int(t), p) for t, p in zip(sf.quantiles, sf.probabilities) if t in times[events]]
        got = stats.kaplan_meier(times, events)
        assert [t for t, _ in got] == [t for t, _ in want]
        assert [s for _, s in got] == pytest.approx([s for _, s in want], abs=1e-12)


# ----------------------------------------------------------------------------- Student's t and the paired tests
def test_students_t_against_closed_forms():
    # df = 1 (Cauchy) and df = 2 have closed forms
    for t in (-30.0, -2.0, -0.3, 0.0, 0.7, 4.0):
        assert stats.t_cdf(t, 1) == pytest.approx(0.5 + np.arctan(t) / np.pi, abs=1e-12)
        assert stats.t_cdf(t, 2) == pytest.approx(0.5 + t / (2 * np.sqrt(2 + t * t)), abs=1e-12)
    assert stats.t_quantile(0.975, 2) == pytest.approx(0.95 * np.sqrt(2 / (1 - 0.95 ** 2)), abs=1e-9)  # solved
    assert stats.t_quantile(0.975, 1) == pytest.approx(np.tan(np.pi * 0.475), rel=1e-12)  # 12.706...


def test_students_t_against_scipy():
    scipy_stats = pytest.importorskip("scipy.stats")
    for t, df in itertools.product((-5.0, -1.3, 0.2, 2.1, 9.0), (1, 4, 9, 14, 29)):
        assert stats.t_cdf(t, df) == pytest.approx(scipy_stats.t.cdf(t, df), abs=1e-12)
    for q, df in itertools.product((0.025, 0.05, 0.95, 0.975), (1, 2, 4, 9, 14)):  # the tests' levels
        assert stats.t_quantile(q, df) == pytest.approx(scipy_stats.t.ppf(q, df), rel=1e-10, abs=1e-12)
    d = [-0.42, 0.1, -0.81, -0.2, -0.33, 0.05, -0.6]
    mean, ci, p = stats.paired_t(d)
    ref = scipy_stats.ttest_1samp(d, 0.0)
    assert p == pytest.approx(ref.pvalue, rel=1e-9) and ci == pytest.approx(tuple(ref.confidence_interval()), rel=1e-9)
    ci90 = stats.paired_t(d, 0.90)[1]
    assert ci90 == pytest.approx(tuple(ref.confidence_interval(0.90)), rel=1e-9)


def test_paired_t_by_hand():
    mean, (lo, hi), p = stats.paired_t([1.0, 2.0, 3.0])  # mean 2, sd 1, se 1/sqrt(3), df 2
    h = 0.95 * np.sqrt(2 / (1 - 0.95 ** 2)) / np.sqrt(3)  # t(0.975, 2), from the df = 2 closed form, x se
    assert mean == 2.0 and lo == pytest.approx(2 - h) and hi == pytest.approx(2 + h)
    t = 2 * np.sqrt(3)  # df = 2: P(|T| > t) = 1 - t / sqrt(2 + t^2)
    assert p == pytest.approx(1 - t / np.sqrt(2 + t * t))
    assert stats.paired_t([0.5, 0.5]) == (0.5, (0.5, 0.5), 0.0)  # no spread at all
    assert stats.paired_t([0.0, 0.0]) == (0.0, (0.0, 0.0), 1.0)


def test_exact_sign_flip_by_hand():
    assert stats.sign_flip_p([0.1, 0.2, 0.3, 0.4, 0.5]) == 2 / 32  # all one sign: the smallest p at n = 5
    assert stats.sign_flip_p([1.0, -1.0]) == 1.0
    # [3, -1, 2]: sums over the 8 sign patterns: +-(3-1+2)=4, +-(3+1+2)=6, +-(3-1-2)=0, +-(-3-1+2)=2 -> |sum| >= 4: 4
    assert stats.sign_flip_p([3.0, -1.0, 2.0]) == 4 / 8


def test_sign_flip_against_scipys_exact_permutation_test():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(2)
    for n in (2, 5, 8):
        d = rng.normal(0.3, 1.0, n)
        ref = scipy_stats.permutation_test((d,), np.mean, permutation_type='samples', n_resamples=np.inf)
        assert stats.sign_flip_p(d) == pytest.approx(ref.pvalue, abs=1e-12)


def test_holm_by_hand():
    assert stats.holm([0.01, 0.04, 0.03]) == pytest.approx([0.03, 0.06, 0.06])  # 3 x 0.01, 2 x 0.03, max(1 x 0.04)
    assert stats.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert stats.holm([0.02, 0.02]) == pytest.approx([0.04, 0.04])  # ties: the order among them does not matter
    assert stats.holm([]) == []


def test_tost_by_hand_and_against_scipy():
    ci, p = stats.tost([0.01, -0.02, 0.0, 0.02, -0.01], 0.5)  # tight around 0: inside a wide margin
    assert -0.5 < ci[0] < ci[1] < 0.5 and p < 0.001
    ci, p = stats.tost([0.3, -0.4, 0.5, -0.2, 0.1], 0.1)  # wide: not shown
    assert ci[0] < -0.1 and p > 0.05
    assert stats.tost([0.05, 0.05], 0.1)[1] == 0.0 and stats.tost([0.2, 0.2], 0.1)[1] == 1.0  # no spread
    scipy_stats = pytest.importorskip("scipy.stats")
    d = [0.3, -0.1, 0.25, 0.05, 0.4, -0.05]
    ci, p = stats.tost(d, 0.35)
    lower = scipy_stats.ttest_1samp(d, -0.35, alternative='greater').pvalue  # mean > -margin
    upper = scipy_stats.ttest_1samp(d, 0.35, alternative='less').pvalue  # mean < margin
    assert p == pytest.approx(max(lower, upper), rel=1e-9)
    assert ci == pytest.approx(tuple(scipy_stats.ttest_1samp(d, 0.0).confidence_interval(0.90)), rel=1e-9)


# ----------------------------------------------------------------------------- a trend
def test_line_fit_by_hand_and_against_scipy():
    a, b, h = stats.line_fit([0, 1, 2, 3], [1, 3, 5, 7])  # on the line y = 1 + 2x: no residual
    assert (a, b) == pytest.approx((1.0, 2.0)) and h == pytest.approx(0.0, abs=1e-12)
    a, b, h = stats.line_fit([0, 2], [1, 0])  # two points: the line, no noise to measure
    assert (a, b, h) == (1.0, -0.5, None)
    scipy_stats = pytest.importorskip("scipy.stats")
    x, y = [21.6, 22.6, 23.6, 24.6, 25.6], [0.4, -1.1, 1.9, 2.2, 4.0]
    ref = scipy_stats.linregress(x, y)
    a, b, h = stats.line_fit(x, y)
    assert (a, b) == pytest.approx((ref.intercept, ref.slope), rel=1e-12)
    assert h == pytest.approx(scipy_stats.t.ppf(0.975, 3) * ref.stderr, rel=1e-10)
