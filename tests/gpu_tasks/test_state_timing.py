"""Timing program states in groups: interleaved rounds, repeats that follow the spread,
failures kept per state, and the rule that labels a step faster, neutral or slower."""
from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest

from gpu_tasks.effect import classify, compared_whole, speedup_interval, step_effect
from gpu_tasks.state_timing import StateGroupRequest, measure_rounds, relative_iqr, time_states_job
from gpu_tasks.timing_session import Sampler, runs_per_sample, undecided_states

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


@pytest.mark.parametrize("low, high, expected", [
    (1.10, 1.30, "faster"),       # the whole interval above 1 + 5%
    (1.04, 1.30, "unresolved"),   # reaches into the margin
    (0.97, 1.03, "neutral"),      # inside [1/1.05, 1.05]
    (0.90, 1.03, "unresolved"),
    (0.50, 0.90, "slower"),
    (0.50, 0.96, "unresolved"),
])
def test_the_effect_comes_from_the_interval_never_neutral_by_default(low, high, expected):
    assert classify(low, high) == expected


def test_step_effect_needs_both_sides_and_five_rounds():
    fast = step_effect([100.0, 101.0, 99.0, 100.0, 100.5], [50.0, 50.5, 49.5, 50.0, 50.2], "k", paired=True)
    assert fast["effect"] == "faster" and fast["speedup_low"] <= fast["speedup"] <= fast["speedup_high"]
    assert step_effect(None, [50.0] * 5, "k") == {"speedup": None, "speedup_low": None, "speedup_high": None,
                                                   "effect": None}
    three = step_effect([100.0] * 3, [50.0] * 3, "k")
    assert three["effect"] == "unresolved" and three["speedup"] == 2.0 and three["speedup_low"] is None


def test_pairing_by_round_cancels_what_moves_both_sides_of_a_round():
    # the machine slows down by 2x in rounds 2-4: both sides move together
    before = [100.0, 200.0, 200.0, 200.0, 100.0, 100.0, 200.0]
    after = [97.0, 194.0, 194.0, 194.0, 97.0, 97.0, 194.0]
    paired = step_effect(before, after, "k", paired=True)
    unpaired = step_effect(before, after, "k", paired=False)
    assert paired["effect"] == "neutral" and paired["speedup"] == pytest.approx(100 / 97)
    assert unpaired["effect"] == "unresolved"  # resampled apart, the drift swamps a 3% difference


def test_the_interval_is_seeded_by_the_step():
    rng = np.random.default_rng(7)
    b, a = list(100 + rng.normal(0, 3, 40)), list(90 + rng.normal(0, 3, 40))
    assert speedup_interval(b, a, "step-1") == speedup_interval(b, a, "step-1")  # the same bytes every build
    assert speedup_interval(b, a, "step-1") != speedup_interval(b, a, "step-2")


def test_a_state_goes_on_while_a_comparison_it_is_part_of_is_undecided():
    steady = [100.0, 100.5, 99.5, 100.2, 99.8]
    samples = {0: steady, 1: [50.0, 50.2, 49.8, 50.1, 49.9],        # 0 -> 1: faster, decided
               2: [100.0, 60.0, 140.0, 80.0, 120.0],                 # 0 -> 2: undecided
               3: [100.0, 100.0, 100.0, 100.0], 4: [5.0, 5.0, 5.0, 5.0]}  # 3 -> 4: too few rounds yet
    assert undecided_states(samples, [(0, 1), (0, 2), (3, 4)], 0.03, 5) == {0, 2, 3, 4}
    assert undecided_states(samples, [(0, 1)], 0.03, 5) == {2}  # 2, in no pair: its spread is large
    # an interval narrower than TIGHT that straddles the margin's bound is at the bound: no more rounds
    border = [104.9, 105.1, 105.0, 104.95, 105.05, 105.0]
    assert undecided_states({0: [100.0] * 6, 1: [100 * 100 / v for v in border]}, [(0, 1)], 0.03, 5) == set()


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

    # the second nest went on for another state: the first's rounds are the ones both have
    assert state_samples([[10.0, 12.0, 11.0], [5.0, 7.0, 6.0, 8.0]]) == [15.0, 19.0, 17.0]


def test_a_small_state_or_a_sampled_one_is_timed_whole_as_well_in_a_nest_session():
    states = (MAX_NEST + SUM_NEST + DIV_NEST, MAX_NEST + SUM_NEST + PAR_DIV_NEST)
    result = time_states_job(StateGroupRequest(states, SOFTMAX_SIG, min_rounds=5, max_rounds=6, min_repeat_ms=1,
                                               unit="nest", pairs=((0, 1),), whole_below_us=0.0))
    assert result.nests == (3, 3) and result.whole == (None, None)  # same nests, not small: by nests only
    result = time_states_job(StateGroupRequest(states, SOFTMAX_SIG, min_rounds=5, max_rounds=6, min_repeat_ms=1,
                                               unit="nest", pairs=((0, 1),), whole_below_us=1e9))
    assert all(w is not None and w.ok and len(w.samples_us) >= 5 for w in result.whole)  # "small": timed whole
    result = time_states_job(StateGroupRequest(states, SOFTMAX_SIG, min_rounds=5, max_rounds=5, min_repeat_ms=1,
                                               unit="nest", whole=(1,)))
    assert result.whole[0] is None and result.whole[1].ok   # the agreement sample


FUSED_MAX_SUM = ("L^{64}_{b=0}[L^{256}_{a=0}[D^{f32,g}_{b}=max(D^{f32,g}_{b},A^{f32,g}_{b,a});];"
                 "L^{256}_{a=0}[E^{f32,g}_{b}=E^{f32,g}_{b}+exp(A^{f32,g}_{b,a}-D^{f32,g}_{b});];];")


def test_a_step_that_changes_the_number_of_nests_is_timed_whole_only_under_its_bound():
    states = (MAX_NEST + SUM_NEST + DIV_NEST, FUSED_MAX_SUM + DIV_NEST)

    def timed(bound_us):
        return time_states_job(StateGroupRequest(states, SOFTMAX_SIG, min_rounds=5, max_rounds=5, min_repeat_ms=1,
                                                 unit="nest", pairs=((0, 1),), whole_below_us=0.0,
                                                 whole_changed_below_us=bound_us))
    short = timed(1e9)  # every side is "short": the fusion is compared on whole states
    assert short.nests == (3, 2) and all(w is not None and w.ok for w in short.whole)
    long = timed(0.0)   # no side is short: nest sums decide
    assert long.nests == (3, 2) and long.whole == (None, None) and all(s.ok for s in long.states)


@pytest.mark.parametrize("nests, times_us, expected", [
    ((3, 3), (100.0, 90.0), False),   # same nests, not small: nest sums
    ((3, 3), (4.0, 90.0), True),      # a side under whole_below_us (5)
    ((3, 2), (100.0, 90.0), True),    # fewer nests with a side under whole_changed_below_us (500)
    ((3, 2), (800.0, 600.0), False),  # fewer nests, both sides long
    ((3, 2), (800.0, 499.0), True),
])
def test_the_rule_that_sends_a_comparison_to_whole_states(nests, times_us, expected):
    assert compared_whole(nests, times_us, 5.0, 500.0) is expected
    assert compared_whole(nests, times_us, 5.0) is (nests[0] != nests[1] or min(times_us) < 5.0)  # no bound


class RecordingModule:
    """A module whose evaluators are recorded with their batch settings; each returns scripted means."""

    def __init__(self, means):
        self.means, self.made, self.calls = list(means), [], []

    def time_evaluator(self, name, device, number, repeat, min_repeat_ms):
        self.made.append({"number": number, "repeat": repeat, "min_repeat_ms": min_repeat_ms})
        settings = len(self.made) - 1

        def evaluate(*args):
            self.calls.append(settings)
            return FakeResult(self.means.pop(0))
        return evaluate


def test_a_sampler_calibrates_its_batch_once_and_keeps_it_whatever_the_later_samples():
    # the calibrating call (TVM grows its batch to min_repeat_ms) measures 30 µs per run: batches of
    # ceil(2 ms / 30 µs) = 67 runs from then on, never regrown, however fast a later sample comes out
    module = RecordingModule([30e-6, 31e-6, 10e-6, 29e-6])
    sampler = Sampler(module, "main", None, 2)
    assert sampler.runs is None
    means = [sampler().mean for _ in range(4)]
    assert means == [30e-6, 31e-6, 10e-6, 29e-6]
    assert sampler.runs == 67
    assert module.made == [{"number": 1, "repeat": 1, "min_repeat_ms": 2},
                           {"number": 67, "repeat": 1, "min_repeat_ms": 0}]
    assert module.calls == [0, 1, 1, 1]


@pytest.mark.parametrize("mean_s, min_repeat_ms, runs", [
    (30e-6, 2, 67), (1e-3, 2, 2), (0.8e-3, 2, 3), (2e-3, 2, 1), (5e-3, 2, 1), (0.0, 2, 1), (1e-6, 10, 10_000),
])
def test_a_sample_is_the_fewest_runs_that_last_the_sample_length(mean_s, min_repeat_ms, runs):
    assert runs_per_sample(mean_s, min_repeat_ms) == runs


def test_a_sampler_on_a_compiled_function_times_it_in_batches_of_about_the_sample_length():
    from gpu_tasks.cache import TIMING_CACHE
    from gpu_tasks.inputs import draw_inputs, plan_inputs
    from gpu_tasks.jobs import load_signature
    from gpu_tasks.runner import device_for, make_arguments
    from leir.parse import parse_program

    signature, program = load_signature(SIG), parse_program(PARALLEL)
    built = TIMING_CACHE.build(program, signature, "llvm")
    device = device_for("llvm")
    args = make_arguments(signature, draw_inputs(signature, plan_inputs(signature, [program]), 0, 0), device)
    sampler = Sampler(built.executable.mod, "main", device, 2)
    first = sampler(*args).mean
    samples = [sampler(*args).mean for _ in range(3)]
    assert sampler.runs == runs_per_sample(first, 2) and sampler.runs >= 1
    # the same function in the same process: its later samples are within a factor of the first
    assert all(first / 4 < s < first * 4 for s in samples)
