"""Timing program states in groups (issue 24): interleaved rounds, repeats that follow the spread,
failures kept per state, and the rule that labels a step faster, neutral or slower."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from gpu_tasks.effect import effect_class, step_effect
from gpu_tasks.state_timing import StateGroupRequest, measure_rounds, relative_iqr, time_states_job

SIG = json.dumps({"tensors": [{"name": "A", "shape": [64, 64], "dtype": "float32", "role": "input"},
                              {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "input"},
                              {"name": "D", "shape": [64, 64], "dtype": "float32", "role": "output"}]})
NAIVE = "B^{64}_{tx=0}L^{64}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
PARALLEL = "P^{64}_{d=0}L^{64}_{a=0}L^{64}_{c=0}[D^{f32,g}_{d,a}=D^{f32,g}_{d,a}+A^{f32,g}_{d,c}*C^{f32,g}_{c,a};];"
REORDERED = "B^{64}_{tx=0}L^{64}_{c=0}L^{64}_{a=0}[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"


def test_a_group_is_timed_in_one_session_with_per_state_samples():
    request = StateGroupRequest((NAIVE, PARALLEL, REORDERED), SIG, min_rounds=3, max_rounds=5, min_repeat_ms=1)
    result = time_states_job(request)
    assert [s.status for s in result.states] == ["ok", "ok", "ok"]
    for s in result.states:
        assert 3 <= len(s.samples_us) <= 5 and all(v > 0 for v in s.samples_us)
        assert s.median_us == pytest.approx(float(np.median(s.samples_us)))
        assert s.spread == pytest.approx(relative_iqr(s.samples_us))
    assert result.fingerprint["cpu_model"] and result.fingerprint["id"] and result.rounds >= 3
    assert result.build_s > 0 and result.measure_s > 0


def test_a_state_that_does_not_parse_or_build_fails_alone():
    bad_syntax = "B^{64}_{tx=0}[D^{f32,g}_{tx="
    out_of_range = "B^{64}_{tx=0}L^{64}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a+100};];"
    result = time_states_job(StateGroupRequest((NAIVE, bad_syntax, out_of_range), SIG, min_rounds=2, max_rounds=2,
                                               min_repeat_ms=1))
    assert result.states[0].ok and result.states[0].median_us > 0
    assert result.states[1].status == "invalid" and "state 1" in result.states[1].error
    assert result.states[2].status in ("invalid", "build_error") and result.states[2].error


@dataclass
class FakeResult:
    mean: float


class FakeEvaluator:
    """Returns its scripted times in order and records the calls in a shared log."""

    def __init__(self, name, times, log):
        self.name, self.times, self.log = name, list(times), log

    def __call__(self, *args):
        self.log.append(self.name)
        return FakeResult(self.times.pop(0) if self.times else 1.0)


def test_rounds_alternate_their_order_and_stop_per_state_when_the_spread_is_small():
    log = []
    steady = FakeEvaluator("steady", [1.0] * 20, log)
    noisy = FakeEvaluator("noisy", [1.0, 0.5, 2.0, 1.0, 0.6, 1.8, 1.0, 0.7, 1.5, 1.0, 1.0, 1.0], log)
    request = StateGroupRequest((), SIG, min_rounds=3, max_rounds=6, target_spread=0.03)
    samples, rounds = measure_rounds([steady, noisy], [], request)
    # warm-up (not a sample), then forward, reversed, forward; after that only the noisy one goes on
    assert log[:8] == ["steady", "noisy", "steady", "noisy", "noisy", "steady", "steady", "noisy"]
    assert len(samples[0]) == 3 and len(samples[1]) == rounds == 6
    assert log[8:] == ["noisy"] * 3


@pytest.mark.parametrize("speedup, spread, expected", [
    (1.01, 0.0, "neutral"),     # inside the 2% floor
    (1.5, 0.01, "faster"),
    (1.10, 0.06, "neutral"),    # 10% faster, but twice the spread is 12%
    (1.13, 0.06, "faster"),
    (0.5, 0.01, "slower"),
    (1 / 1.10, 0.06, "neutral"),
    (float("inf"), 0.0, "faster"),
])
def test_effect_class_follows_the_measured_spread(speedup, spread, expected):
    assert effect_class(speedup, spread) == expected


def test_step_effect_needs_both_sides():
    assert step_effect(100.0, 50.0, 0.01, 0.02) == {"speedup": 2.0, "spread": 0.02, "effect": "faster"}
    assert step_effect(None, 50.0, None, 0.02) == {"speedup": None, "spread": None, "effect": None}


# --- nest by nest (the measure stage's default): each distinct nest compiled and timed once -------------

SOFTMAX_SIG = json.dumps({"tensors": [{"name": "A", "shape": [64, 256], "dtype": "float32", "role": "input"},
                                      {"name": "C", "shape": [64, 256], "dtype": "float32", "role": "output"}]})
MAX_NEST = "L^{64}_{b=0}L^{256}_{a=0}[D^{f32,g}_{b}=max(D^{f32,g}_{b},A^{f32,g}_{b,a});];"
SUM_NEST = "L^{64}_{b=0}L^{256}_{a=0}[E^{f32,g}_{b}=E^{f32,g}_{b}+exp(A^{f32,g}_{b,a}-D^{f32,g}_{b});];"
DIV_NEST = "L^{64}_{b=0}L^{256}_{a=0}[C^{f32,g}_{b,a}=exp(A^{f32,g}_{b,a}-D^{f32,g}_{b})/E^{f32,g}_{b};];"
PAR_DIV_NEST = "P^{64}_{b=0}L^{256}_{a=0}[C^{f32,g}_{b,a}=exp(A^{f32,g}_{b,a}-D^{f32,g}_{b})/E^{f32,g}_{b};];"


def test_nest_timing_compiles_each_distinct_nest_once_and_sums_a_states_nests():
    states = (MAX_NEST + SUM_NEST + DIV_NEST, MAX_NEST + SUM_NEST + PAR_DIV_NEST)
    result = time_states_job(StateGroupRequest(states, SOFTMAX_SIG, min_rounds=3, max_rounds=4, min_repeat_ms=1,
                                               unit="nest"))
    assert [s.status for s in result.states] == ["ok", "ok"]
    assert result.functions == 4  # the two states share two of their three nests
    for s in result.states:
        assert 3 <= len(s.samples_us) <= 4 and all(v > 0 for v in s.samples_us)
        assert s.median_us == pytest.approx(float(np.median(s.samples_us)))


def test_nest_timing_fails_a_bad_state_alone():
    bad = "B^{64}_{tx=0}L^{64}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a+100};];"
    result = time_states_job(StateGroupRequest((NAIVE, bad, "B^{64}_{tx="), SIG, min_rounds=2, max_rounds=2,
                                               min_repeat_ms=1, unit="nest"))
    assert result.states[0].ok and result.states[0].median_us > 0
    assert result.states[1].status in ("invalid", "build_error") and result.states[1].error
    assert result.states[2].status == "invalid"


def test_a_states_samples_are_its_nests_samples_summed_round_by_round():
    from gpu_tasks.nest_timing import state_samples

    # the second nest reached its spread after two rounds: its median stands in for the rest
    assert state_samples([[10.0, 12.0, 11.0, 13.0], [5.0, 7.0]]) == [15.0, 19.0, 17.0, 19.0]


def test_a_nests_spread_is_weighed_against_the_smallest_state_it_is_part_of():
    from gpu_tasks.nest_timing import unit_spreads

    samples = [[100.0, 101.0, 99.0], [2.0, 2.4, 1.6], [2.0, 2.4, 1.6]]
    # unit 1 belongs to a 102 µs state (units 0 and 1); unit 2 runs alone in a state of its own
    states_of = [[[(0, 1), (1, 1)]], [[(0, 1), (1, 1)]], [[(2, 1)]]]
    spreads = unit_spreads(samples, states_of)
    assert spreads[0] == pytest.approx(1.0 / 102.0)
    assert spreads[1] == pytest.approx(0.4 / 102.0)
    assert spreads[2] == pytest.approx(0.2)
