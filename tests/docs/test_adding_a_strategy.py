"""docs/adding-a-strategy.md stays true: its Python blocks run as printed, the step it shows is the
step the rule makes, the rule recognises it, refuses the dependent loop, and the step verifies
through TVM as exact."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "adding-a-strategy.md"


@pytest.fixture(scope="module")
def guide() -> dict:
    """The namespace after running every ```python block of the guide in order (the rule, the try,
    the refusal), and the text blocks it says the code prints."""
    text = GUIDE.read_text()
    ns: dict = {}
    blocks = re.findall(r'```python title="([^"]+)"\n(.*?)```', text, re.S)
    assert [title for title, _ in blocks] == ["strategies/rules/operator/reversal.py", "try it", "refused"]
    for title, code in blocks:
        exec(compile(code, f"{GUIDE.name}: {title}", "exec"), ns)
    ns["printed"] = re.findall(r"```text\n(.*?)\n```", text, re.S)
    return ns


def test_the_guide_shows_the_step_its_rule_makes(guide):
    steps = guide["steps"]
    assert [t.after_text for t in steps] == guide["printed"]


def test_the_guide_rule_recognises_its_step_and_no_other(guide):
    from strategies.registry import get

    rule, ctx, (step,) = guide["LoopReversal"](), guide["ctx"], guide["steps"]
    assert rule.recognizes(ctx.program, step.after, ctx.signature)
    assert not rule.recognizes(ctx.program, ctx.program, ctx.signature)
    split = next(get("loop_split").transformations(ctx))
    assert not rule.recognizes(ctx.program, split.after, ctx.signature)
    assert step.facts and step.summary.startswith("Loop a (extent 8)")


def test_the_guide_step_verifies_exactly(guide):
    pytest.importorskip("tvm")
    from gpu_tasks.verify import verify_pair

    (step,) = guide["steps"]
    assert verify_pair(step.before, step.after, guide["ctx"].signature).status == "exact"


def test_the_guide_names_the_attributes_every_strategy_has():
    """The guide's list of what a class states is what the base class declares."""
    from strategies.base import Strategy

    text = GUIDE.read_text()
    for attribute in ("sites", "parameters", "rewrite", "recognizes", "enables", "search_prior", "promise"):
        assert hasattr(Strategy, attribute) and f"`{attribute}" in text, attribute
