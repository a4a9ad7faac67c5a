"""A bad item never stops a batch (issue 15): every batch command is fed items that raise different
exception types; each of them becomes its own JSON error line (type, message, where), the good items
are processed, every item gets exactly one line (or its transformations), and the exit code says
that something failed.

The exceptions are injected where each command hands one item to the library (monkeypatched in this
process), so the test does not depend on which real inputs happen to break a given release."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.gpu_tasks.conftest import MATMUL, MATMUL_SIG

PROBLEMS = Path(__file__).parents[1] / "data" / "kernelbench"
SIG = MATMUL_SIG.to_json()
REORDERED = MATMUL.replace("B^{8}_{tx=0}L^{6}_{a=0}", "L^{6}_{a=0}B^{8}_{tx=0}")


def _rows(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def _raiser(table: dict, key):
    """Raise the exception `table` names for `key` (an item's marker); None: not an item to break."""
    error = table.get(key)
    if error is not None:
        raise error


def _program_batch(tmp_path: Path, items: list[tuple[str, str]]) -> Path:
    path = tmp_path / "programs.jsonl"
    path.write_text("".join(json.dumps({"id": i, "signature": SIG, "leir": leir}) + "\n" for i, leir in items))
    return path


def test_translate_turns_any_exception_into_that_files_record(monkeypatch, tmp_path):
    import leir.frontend

    real = leir.frontend.translate
    errors = {"a": KeyError("s"), "b": IndexError("Target 3332 is out of bounds"), "c": SystemExit(3)}
    files = []
    for name in ("a", "b", "c"):
        path = tmp_path / f"{name}.py"
        path.write_text((PROBLEMS / "19_ReLU.py").read_text())
        files.append(path)
    files.insert(1, PROBLEMS / "19_ReLU.py")  # a good file between the bad ones

    def translate(model, inputs, dtype=None, **kwargs):
        _raiser(errors, translate.current)
        return real(model, inputs, dtype, **kwargs)

    import cli.translate

    original_one = cli.translate.translate_one

    def translate_one(path, *args, **kwargs):
        translate.current = Path(path).stem
        return original_one(path, *args, **kwargs)

    monkeypatch.setattr(leir.frontend, "translate", translate)
    monkeypatch.setattr(cli.translate, "translate_one", translate_one)
    result = CliRunner().invoke(app, ["translate", *map(str, files), "--set", "batch_size=2",
                                      "--max-elements", "64", "--dtype", "float64"])
    rows = _rows(result)
    assert result.exit_code == 1 and len(rows) == 4
    assert [r["ok"] for r in rows] == [False, True, False, False]
    assert [r.get("exception", {}).get("type") for r in rows] == ["KeyError", None, "IndexError", "SystemExit"]
    assert "Target 3332" in rows[2]["error"] and rows[2]["exception"]["line"] > 0
    assert rows[1]["verification"]["status"] == "exact"


def test_verify_turns_an_exception_while_preparing_a_pair_into_its_line(monkeypatch, tmp_path):
    import gpu_tasks.verify

    real = gpu_tasks.verify.pair_request
    errors = {"x": ValueError("bad tolerance"), "y": RecursionError("too deep")}

    def pair_request(before, after, signature, **kwargs):
        _raiser(errors, after.strip())
        return real(before, after, signature, **kwargs)

    monkeypatch.setattr(gpu_tasks.verify, "pair_request", pair_request)
    pairs = [{"id": 1, "signature": SIG, "before": MATMUL, "after": "x"},
             {"id": 2, "signature": SIG, "before": MATMUL, "after": REORDERED},
             {"id": 3, "signature": SIG, "before": MATMUL, "after": "y"}]
    batch = tmp_path / "pairs.jsonl"
    batch.write_text("".join(json.dumps(p) + "\n" for p in pairs) + "{broken\n")
    result = CliRunner().invoke(app, ["verify", "--batch", str(batch), "--workers", "1"])
    rows = _rows(result)
    assert result.exit_code == 1 and [r["id"] for r in rows] == [1, 2, 3, None]
    assert [r["status"] for r in rows] == ["invalid", "exact", "invalid", "invalid"]
    assert rows[0]["exception"]["type"] == "ValueError" and rows[2]["exception"]["type"] == "RecursionError"
    assert rows[0]["exception"]["file"].endswith("test_cli_batch_isolation.py")
    assert "not JSON" in rows[3]["error"]


def test_tokens_batch_isolates_a_program_whose_counting_raises(monkeypatch, tmp_path):
    import flows.token_stats

    real = flows.token_stats.count_program
    errors = {"B^{1}_{tx=0}[D^{f32,g}_{0,0}=A^{f32,g}_{0,0};];": ZeroDivisionError("division by zero"),
              REORDERED: TypeError("unhashable type")}

    def count_program(leir, signature):
        _raiser(errors, leir)
        return real(leir, signature)

    monkeypatch.setattr(flows.token_stats, "count_program", count_program)
    batch = _program_batch(tmp_path, [("p", "B^{1}_{tx=0}[D^{f32,g}_{0,0}=A^{f32,g}_{0,0};];"), ("q", MATMUL),
                                      ("r", REORDERED)])
    result = CliRunner().invoke(app, ["tokens", "--batch", str(batch)])
    rows = _rows(result)
    assert result.exit_code == 2 and [r["id"] for r in rows] == ["p", "q", "r"]
    assert rows[0]["exception"]["type"] == "ZeroDivisionError" and rows[0]["leir_tokens"] is None
    assert rows[2]["exception"]["type"] == "TypeError"
    assert rows[1]["error"] is None and rows[1]["leir_tokens"] > 0 and "exception" not in rows[1]


def test_eval_scores_the_other_lines_when_one_raises(monkeypatch, tmp_path):
    import evaluation.harness

    real = evaluation.harness.parse_response
    errors = {"boom": AttributeError("'NoneType' object has no attribute 'items'"), "bang": OverflowError("big")}

    def parse_response(text, **kwargs):
        _raiser(errors, text)
        return real(text, **kwargs)

    monkeypatch.setattr(evaluation.harness, "parse_response", parse_response)
    answer = json.dumps({"transformed_IR": REORDERED, "applied_strategy": "loop_reorder"})
    good = f"<think>swap</think><answer>{answer}</answer>"
    lines = [{"id": "a", "signature": SIG, "original_IR": MATMUL, "response": "boom"},
             {"id": "b", "signature": SIG, "original_IR": MATMUL, "response": good},
             {"id": "c", "signature": SIG, "original_IR": MATMUL, "response": "bang"}]
    path = tmp_path / "predictions.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    result = CliRunner().invoke(app, ["eval", str(path), "--json", "--no-time", "--workers", "1"])
    rows = _rows(result)
    assert result.exit_code == 0 and [r.get("id") for r in rows[:3]] == ["a", "b", "c"]
    assert [r["status"] for r in rows[:3]] == ["internal_error", "exact", "internal_error"]
    assert rows[0]["exception"]["type"] == "AttributeError" and rows[2]["exception"]["type"] == "OverflowError"
    assert rows[1]["close_pass"] and rows[1]["strategy_label_pass"] and "exception" not in rows[1]
    assert rows[3]["summary"]["n"] == 3


def test_apply_batch_goes_on_after_a_program_or_a_strategy_raises(monkeypatch, tmp_path):
    from strategies.registry import get

    reorder = get("loop_reorder")
    real = type(reorder).transformations

    def transformations(self, ctx):
        if ctx.signature.tensors[0].shape[0] == 8 and len(ctx.program.nests[0].loops) == 3:
            raise NotImplementedError("a strategy bug")
        return real(self, ctx)

    monkeypatch.setattr(type(reorder), "transformations", transformations)
    small = "B^{4}_{tx=0}L^{5}_{a=0}[D^{f32,g}_{tx,a}=A^{f32,g}_{tx,a};];"
    small_sig = {"tensors": [{"name": "A", "shape": [4, 5], "dtype": "float32", "role": "input"},
                             {"name": "D", "shape": [4, 5], "dtype": "float32", "role": "output"}]}
    path = tmp_path / "programs.jsonl"
    path.write_text(json.dumps({"id": "matmul", "signature": SIG, "leir": MATMUL}) + "\n"
                    + json.dumps({"id": "syntax", "signature": SIG, "leir": "B^{4"}) + "\n"
                    + json.dumps({"id": "copy", "signature": small_sig, "leir": small}) + "\n")
    result = CliRunner().invoke(app, ["apply", "loop_reorder", "--batch", str(path), "--no-cot"])
    rows = _rows(result)
    assert result.exit_code == 1
    assert rows[0] == {"id": "matmul", "strategy": "loop_reorder", **{k: rows[0][k] for k in ("error", "exception")}}
    assert rows[0]["exception"]["type"] == "NotImplementedError"
    assert rows[1]["id"] == "syntax" and rows[1]["exception"]["type"] == "LeirSyntaxError"
    assert [r["id"] for r in rows[2:]] == ["copy"] and rows[2]["after"].startswith("L^{5}_{a=0}B^{4}_{tx=0}")


@pytest.mark.parametrize("emit", ["tir", "cuda"])
def test_lower_batch_isolates_what_each_program_raises(monkeypatch, tmp_path, emit):
    import leir.lower

    name = "cuda_source" if emit == "cuda" else "lower_to_script"
    real = getattr(leir.lower, name)
    errors = {REORDERED: MemoryError("out of memory")}

    def lower(program, signature, *args):
        from leir.printer import format_program

        _raiser(errors, format_program(program))
        return real(program, signature, *args)

    monkeypatch.setattr(leir.lower, name, lower)
    batch = _program_batch(tmp_path, [("bad", REORDERED), ("syntax", "B^{4"), ("good", MATMUL)])
    args = ["lower", "--batch", str(batch)] + (["--emit", "cuda"] if emit == "cuda" else [])
    result = CliRunner().invoke(app, args)
    rows = _rows(result)
    assert result.exit_code == 1 and [r["id"] for r in rows] == ["bad", "syntax", "good"]
    assert rows[0]["exception"]["type"] == "MemoryError" and rows[0][emit] is None
    assert rows[1]["exception"]["type"] == "LeirSyntaxError"
    assert rows[2]["error"] is None and ("__global__" in rows[2][emit] if emit == "cuda" else "prim_func" in rows[2][emit])
