"""No prompt line predicts the strategy better than its base rate (issue 25): `flows.reports.line_leakage`
on synthetic samples whose prompts are made by `strategies.cot.prompt`, as the filter stage makes them."""
from __future__ import annotations

import json

import pytest

from flows.reports import PROMPT_LINE_KINDS, line_leakage, prompt_lines
from leir import Signature, parse_program
from strategies.cot import TASK_MULTI, prompt

STRATEGIES = ["loop_split", "loop_reorder", "loop_tiling", "loop_unrolling", "compute_inline", "cache_read_write",
              "loop_fusion", "reduction_factorization", "set_storage_scope"]
PROGRAM = "L^{4}_{a=0}L^{5}_{c=0}[D^{f32,g}_{a,c}=A^{f32,g}_{a,c}*2;];"


def signature(i: int) -> Signature:
    return Signature.from_json({"tensors": [{"name": "A", "shape": [4, 5 + i], "dtype": "float32", "role": "input"},
                                            {"name": "D", "shape": [4, 5 + i], "dtype": "float32", "role": "output"}]})


def sample(target: str, strategies: list[str], program: int = 0) -> dict:
    task = (TASK_MULTI.format(k=len(strategies)),) if len(strategies) > 1 else ()
    return {"prompt": prompt(parse_program(PROGRAM), signature(program), target, *task),
            "strategies": json.dumps(strategies)}


def test_prompt_lines_are_the_target_known_tensors_and_instruction():
    lines = prompt_lines(sample("cuda", ["loop_split"])["prompt"])
    assert list(lines) == list(PROMPT_LINE_KINDS)
    assert lines["target"].endswith("will run on a GPU (CUDA):")
    assert lines["known tensors"].startswith("The known tensors are 'A' with the dtype torch.float32")
    assert lines["instruction"].startswith("Apply exactly one optimization strategy")
    with pytest.raises(ValueError, match="known-tensors"):
        prompt_lines("no prompt of ours")


def test_a_target_line_chosen_by_the_strategy_gives_the_label_away():
    """The old behaviour: GPU exactly for loop_binding."""
    samples = [sample("cuda", ["loop_binding"]) for _ in range(10)]
    samples += [sample("llvm", [s]) for s in STRATEGIES for _ in range(10)]
    leak = line_leakage(samples)
    worst = leak["target"]["worst"]
    assert worst["strategy"] == "loop_binding" and worst["line"].endswith("GPU (CUDA):")
    assert worst["share_in_line"] == 1.0 and worst["share_overall"] == 0.1 and leak["target"]["excess"] == 0.9
    assert leak["target"]["excess"] > 0.10
    # the other lines are the same in every prompt: no information at all
    assert leak["known tensors"]["excess"] == leak["instruction"]["excess"] == 0.0


def test_a_target_that_belongs_to_the_program_leaks_nothing():
    """Targets drawn per program, whatever the strategies; binding only on GPU programs and P loops
    only on CPU ones lift their own share by less than 10 points when they are a small part of both."""
    samples = []
    for program in range(8):
        target = "cuda" if program % 4 == 0 else "llvm"
        own = "loop_binding" if target == "cuda" else "loop_parallelization"
        samples += [sample(target, [s], program) for s in STRATEGIES for _ in range(3)]
        samples += [sample(target, [own], program)]
        samples += [sample(target, (STRATEGIES * 2)[program:program + 3], program)]
    leak = line_leakage(samples)
    for kind in PROMPT_LINE_KINDS:
        assert leak[kind]["excess"] <= 0.10, (kind, leak[kind]["worst"])
    assert leak["target"]["lines_measured"] == 2 and leak["instruction"]["lines"] == 2
    # multi-answer samples weigh 1/k per strategy: the shares of a prompt sum to one
    top = leak["target"]["top"]
    assert 0 < top["share_in_line"] < 0.2


def test_lines_carried_by_few_prompts_are_not_measured():
    # one program with only loop_split samples: its known-tensors line is 2% of the prompts
    samples = [sample("llvm", [s], 1) for s in STRATEGIES for _ in range(11)]
    samples += [sample("llvm", ["loop_split"], 2) for _ in range(2)]
    leak = line_leakage(samples)
    assert leak["known tensors"]["lines"] == 2 and leak["known tensors"]["lines_measured"] == 1
    assert leak["known tensors"]["excess"] <= 0.01
    assert line_leakage(samples, min_share=0.0)["known tensors"]["excess"] > 0.8
