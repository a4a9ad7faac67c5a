"""The evaluation harness (`steptp eval`, evaluation.harness): crafted predictions covering every
outcome, through the CLI and the library; the response reader; the published-format reader."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from evaluation.harness import CHECKS, EvalOptions, Prediction, evaluate, summarize
from evaluation.published import PublishedFormatError, program_from_prompt, signature_from_prompt, tensors_from_prompt
from evaluation.response import (
    Requested,
    ResponseError,
    parse_response,
    requested_answers,
)
from gpu_tasks.pool import WorkerPool
from leir.parse import parse_program
from strategies.cot import TASK_MULTI, prompt
from tests.gpu_tasks.conftest import MATMUL, MATMUL_SIG, MATMUL_WRONG

DATA = Path(__file__).parent.parent / "data"
SIG = MATMUL_SIG.to_json()
STMT = "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*C^{f32,g}_{c,a};];"
REORDERED = "L^{6}_{a=0}B^{8}_{tx=0}L^{64}_{c=0}" + STMT  # what loop_reorder makes of MATMUL
REORDERED_RENAMED = REORDERED.replace("_{a=0}", "_{f=0}").replace("tx,a}", "tx,f}").replace("c,a}", "c,f}")
PARALLEL = "B^{8}_{tx=0}P^{6}_{a=0}L^{64}_{c=0}" + STMT  # loop_parallelization
RENAMED = MATMUL.replace("_{a=0}", "_{f=0}").replace("_{c=0}", "_{g=0}").replace("tx,a}", "tx,f}") \
    .replace("tx,c}", "tx,g}").replace("c,a}", "g,f}")
# reduction_factorization: a reassociation, equal within float32 rounding only
FACTORIZED = ("B^{8}_{tx=0}L^{6}_{a=0}L^{16}_{d=0}L^{4}_{c=0}[E^{f32,g}_{tx,a,c}=E^{f32,g}_{tx,a,c}"
              "+A^{f32,g}_{tx,d*4+c}*C^{f32,g}_{d*4+c,a};];B^{8}_{tx=0}L^{6}_{a=0}L^{4}_{c=0}"
              "[D^{f32,g}_{tx,a}=D^{f32,g}_{tx,a}+E^{f32,g}_{tx,a,c};];")
UNKNOWN_TENSOR = MATMUL.replace("C^{f32,g}_{c,a}", "F^{f32,g}_{c,a}")  # parses, cannot be lowered
HUGE_LOOP = "B^{1000000}_{tx=0}L^{1000000}_{a=0}[D^{f32,g}_{0,0}=A^{f32,g}_{0,0};];"  # 10^12 iterations
DEEP_IR = "B^{8}_{tx=0}L^{6}_{a=0}L^{64}_{c=0}[D^{f32,g}_{tx,a}=" + "(" * 1000 + "A^{f32,g}_{tx,c}" + ")" * 1000 + ";];"


def answer(ir, strategy="loop_reorder", think="reasoning") -> str:
    return f"<think>{think}</think><answer>{json.dumps({'transformed_IR': ir, 'applied_strategy': strategy})}</answer>"


def multi(*pairs) -> str:
    items = [{"idx": i, "transformed_IR": ir, "applied_strategy": s} for i, (ir, s) in enumerate(pairs, start=1)]
    return f"<think>options</think><answer>{json.dumps(items)}</answer>"


def line(line_id, response, **extra) -> str:
    return json.dumps({"id": line_id, "signature": SIG, "original_IR": MATMUL, "response": response, **extra})


MULTI_PROMPT_2 = prompt(parse_program(MATMUL), MATMUL_SIG, "llvm", TASK_MULTI.format(k=2))
MULTI_PROMPT_3 = prompt(parse_program(MATMUL), MATMUL_SIG, "llvm", TASK_MULTI.format(k=3))

# id -> (input line, expected status, the checks expected true; every other check is false)
CASES = {
    "not-the-format": (line("not-the-format", "The answer is " + REORDERED), "format_error", set()),
    "code-fences": (line("code-fences", "```\n<think>r</think>\n  <answer>\n```json\n"
                         + json.dumps({"transformed_IR": REORDERED, "applied_strategy": "loop_reorder"})
                         + "\n```\n</answer>\n```"), "exact", {"format", "different", "build", "execute", "equal",
                                                                 "close", "strategy_label", "strategy_label_exact",
                                                                 "require_num"}),
    "extra-key": (line("extra-key", "<think>r</think><answer>" + json.dumps(
        {"transformed_IR": REORDERED, "applied_strategy": "loop_reorder", "note": "x"}) + "</answer>"),
        "format_error", set()),
    "identical": (line("identical", answer(MATMUL)), "exact",
                  {"format", "build", "execute", "equal", "close"}),
    "alpha-renamed": (line("alpha-renamed", answer(RENAMED)), "exact",
                      {"format", "build", "execute", "equal", "close"}),
    "build-error": (line("build-error", answer(UNKNOWN_TENSOR)), "build_error", {"format", "different"}),
    "not-leir": (line("not-leir", answer("B^{8}_{tx=0}[oops")), "invalid", {"format"}),
    "wrong-result": (line("wrong-result", answer(MATMUL_WRONG)), "mismatch",
                     {"format", "different", "build", "execute"}),
    "exact-right-label": (line("exact-right-label", answer(REORDERED)), "exact",
                          {"format", "different", "build", "execute", "equal", "close", "strategy_label",
                           "strategy_label_exact", "require_num"}),
    "exact-wrong-label": (line("exact-wrong-label", answer(REORDERED, "loop_tiling")), "exact",
                          {"format", "different", "build", "execute", "equal", "close", "require_num"}),
    "unknown-label": (line("unknown-label", answer(REORDERED, "loop_magic")), "exact",
                      {"format", "different", "build", "execute", "equal", "close", "require_num"}),
    "close-reassociating": (line("close-reassociating", answer(FACTORIZED, "reduction_factorization")), "close",
                            {"format", "different", "build", "execute", "close", "strategy_label",
                             "strategy_label_exact", "require_num"}),
    "multi-ok": (line("multi-ok", multi((REORDERED, "loop_reorder"), (PARALLEL, "loop_parallelization")),
                      prompt=MULTI_PROMPT_2), "exact",
                 {"format", "different", "build", "execute", "equal", "close", "strategy_label",
                  "strategy_label_exact", "require_num"}),
    "multi-wrong-count": (line("multi-wrong-count", multi((REORDERED, "loop_reorder"),
                                                          (PARALLEL, "loop_parallelization")),
                               prompt=MULTI_PROMPT_3), "exact",
                          {"format", "different", "build", "execute", "equal", "close", "strategy_label",
                           "strategy_label_exact"}),
    "multi-duplicates": (line("multi-duplicates", multi((REORDERED, "loop_reorder"), (REORDERED_RENAMED, "loop_reorder")),
                              k=2), "exact",
                         {"format", "different", "build", "execute", "equal", "close", "strategy_label",
                          "strategy_label_exact"}),
    "multi-one-wrong": (line("multi-one-wrong", multi((REORDERED, "loop_reorder"), (MATMUL_WRONG, "loop_reorder")),
                             k=2), "mismatch", {"format", "different", "build", "execute"}),
    "single-asked-list-given": (line("single-asked-list-given", multi((REORDERED, "loop_reorder")),
                                     prompt=prompt(parse_program(MATMUL), MATMUL_SIG)), "format_error", set()),
    "huge-loop": (line("huge-loop", answer(HUGE_LOOP)), "rejected", {"format"}),
    "deep-ir": (line("deep-ir", answer(DEEP_IR)), "rejected", {"format"}),
    "deep-json": (line("deep-json", "<think>r</think><answer>{\"transformed_IR\": " + "[" * 1000 + "]" * 1000
                       + ", \"applied_strategy\": \"loop_reorder\"}</answer>"), "rejected", set()),
    "import-in-json": (line("import-in-json", "<think>r</think><answer>{\"transformed_IR\": __import__('os')"
                            ".system('echo pwned'), \"applied_strategy\": \"loop_reorder\"}</answer>"),
                       "rejected", set()),
    "import-in-ir": (line("import-in-ir", answer("__import__('os').system('echo pwned')")), "rejected", set()),
    "huge-text": (line("huge-text", answer(REORDERED, think="x" * 10_000_000)), "rejected", set()),
    "bad-signature": (json.dumps({"id": "bad-signature", "signature": {"tensors": []}, "original_IR": MATMUL,
                                  "response": answer(REORDERED)}), "input_error", set()),
}


def expected_row(status: str, true_checks: set[str]) -> dict:
    checks = {name: name.removesuffix("_pass") in true_checks for name in CHECKS}
    checks["speedup_pass"] = None  # --no-time
    return {**checks, "status": status}


@pytest.fixture(scope="module")
def runner():
    return CliRunner()


def run_eval(runner, *args) -> list[dict]:
    result = runner.invoke(app, ["eval", *args])
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    return [json.loads(text) for text in result.stdout.splitlines()]


def test_cli_scores_every_outcome_in_input_order(runner, tmp_path):
    ids = list(CASES)
    ids.insert(5, "malformed")
    path = tmp_path / "predictions.jsonl"
    path.write_text("\n".join("{not json" if i == "malformed" else CASES[i][0] for i in ids) + "\n")
    rows = run_eval(runner, str(path), "--json", "--no-time", "--workers", "2")
    summary = rows.pop()["summary"]
    assert [r["id"] for r in rows] == [None if i == "malformed" else i for i in ids]
    for i, row in zip(ids, rows, strict=True):
        assert list(row)[:1] == ["id"] and all(name in row for name in (*CHECKS, "status", "error"))
        if i == "malformed":
            assert row["status"] == "input_error" and row["error"].startswith("line 6: not JSON")
            continue
        _, status, true_checks = CASES[i]
        assert {k: row[k] for k in (*CHECKS, "status")} == expected_row(status, true_checks), (i, row)
        assert (row["error"] == "") == (i in {"code-fences", "exact-right-label", "close-reassociating", "multi-ok"}), (i, row)
    assert summary["n"] == len(ids)
    for name in CHECKS:
        expected = None if name == "speedup_pass" else round(sum(r[name] for r in rows) / len(rows), 6)
        assert summary[name] == expected, name
    by_id = dict(zip(ids, rows, strict=True))
    assert "code injection" in by_id["import-in-json"]["error"] and "__import__" in by_id["import-in-json"]["error"]
    assert "statement executions exceed" in by_id["huge-loop"]["error"]
    assert "nesting depth" in by_id["deep-ir"]["error"] and "nesting depth" in by_id["deep-json"]["error"]
    assert "10,0" in by_id["huge-text"]["error"]
    assert "not one of the 43" in by_id["unknown-label"]["error"]
    assert "not loop_tiling applied" in by_id["exact-wrong-label"]["error"]
    assert "identical to the original" in by_id["alpha-renamed"]["error"]
    assert "2 distinct valid answers, 3 asked for" in by_id["multi-wrong-count"]["error"]
    assert by_id["multi-ok"]["detail"]["requested"] == {"count": 2, "at_least": False}
    assert [i["status"] for i in by_id["multi-one-wrong"]["detail"]["items"]] == ["exact", "mismatch"]


def test_library_keeps_order_and_reports_per_item():
    predictions = [Prediction(i, SIG, MATMUL, r) for i, r in
                   [("b", answer(MATMUL_WRONG)), ("a", answer(REORDERED)), ("c", "no")]]
    with WorkerPool(workers=2, timeout_s=30.0) as pool:
        results = evaluate(predictions, EvalOptions(time=False), pool)
    assert [r.id for r in results] == ["b", "a", "c"]
    assert [r.status for r in results] == ["mismatch", "exact", "format_error"]
    assert results[1].items[0].verification.bitwise_equal
    assert summarize(results)["close_pass"] == pytest.approx(1 / 3, abs=1e-6)


def test_a_crashing_check_costs_one_answer_only(monkeypatch):
    """A worker that dies mid-verification: that answer is `crash`, the next one is still scored."""
    import evaluation.harness as ev
    from gpu_tasks import testing

    predictions = [Prediction("crash", SIG, MATMUL, answer(REORDERED)), Prediction("ok", SIG, MATMUL, answer(PARALLEL))]
    real = ev.run_checks

    def crashing_first(lines, options, pool=None, progress=None):
        from gpu_tasks.pool import Job

        original_imap = pool.imap

        def imap(jobs):
            jobs = list(jobs)
            jobs[0] = Job(testing.segfault)
            return original_imap(jobs)

        monkeypatch.setattr(pool, "imap", imap)
        return real(lines, options, pool, progress)

    monkeypatch.setattr(ev, "run_checks", crashing_first)
    with WorkerPool(workers=1, timeout_s=30.0) as pool:
        results = evaluate(predictions, EvalOptions(time=False), pool)
    assert results[0].status == "crash" and "SIGSEGV" in results[0].error
    assert results[1].status == "exact"


def test_timing_gives_a_speedup_per_correct_answer(runner, tmp_path):
    path = tmp_path / "one.jsonl"
    path.write_text(line("par", answer(PARALLEL, "loop_parallelization")) + "\n" + line("wrong", answer(MATMUL_WRONG)))
    rows = run_eval(runner, str(path), "--json", "--workers", "1", "--repeats", "3", "--min-repeat-ms", "1")
    par, wrong, last = rows
    assert isinstance(par["speedup_pass"], bool) and par["detail"]["items"][0]["speedup"] > 0
    assert wrong["speedup_pass"] is False and wrong["detail"]["items"][0]["speedup"] is None
    assert last["summary"]["speedup_pass"] in (0.0, 0.5)


def test_table_output_and_usage_errors(runner, tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(line("x", "not an answer") + "\n")
    result = runner.invoke(app, ["eval", str(path), "--no-time", "--workers", "1"])
    assert result.exit_code == 0 and "format_pass" in result.stdout and "format_error" in result.stdout
    assert runner.invoke(app, ["eval"]).exit_code == 2
    assert runner.invoke(app, ["eval", str(path), "--published", str(path)]).exit_code == 2


# --- the lake's test split --------------------------------------------------------------------------

def test_split_scores_against_the_lake(runner, tmp_path):
    from flows.storage import write_shard

    lake = tmp_path / "lake"
    write_shard(lake, "programs", "p", [{"program_id": "p1", "signature": json.dumps(SIG), "leir": MATMUL}])
    write_shard(lake, "steps", "s", [{"step_id": f"s{i}", "program_id": "p1", "before_leir": MATMUL,
                                      "after_leir": REORDERED, "strategy": "loop_reorder"} for i in (1, 2, 3)])
    single = prompt(parse_program(MATMUL), MATMUL_SIG)
    write_shard(lake, "samples", "x", [
        {"sample_id": "t1", "split": "test", "prompt": single, "answer": "", "step_ids": '["s1"]'},
        {"sample_id": "t2", "split": "test", "prompt": single, "answer": "", "step_ids": '["s2"]'},
        {"sample_id": "r1", "split": "train", "prompt": single, "answer": "", "step_ids": '["s3"]'}])
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps(p) for p in [
        {"sample_id": "t1", "response": answer(REORDERED)}, {"sample_id": "r1", "response": answer(REORDERED)},
        {"id": "nope", "response": "x"}]) + "\n")
    rows = run_eval(runner, "--split", "test", "--predictions", str(preds), "--lake", str(lake), "--json",
                    "--no-time", "--workers", "1")
    summary = rows.pop()["summary"]
    assert [(r["id"], r["status"]) for r in rows] == [("t1", "exact"), ("r1", "input_error"),
                                                      ("nope", "input_error"), ("t2", "missing")]
    assert rows[0]["strategy_label_pass"] and "not a sample of the test split" in rows[1]["error"]
    assert summary["n"] == 4 and summary["close_pass"] == 0.25


def test_split_scores_the_whole_split_and_its_clean_part(runner, tmp_path):
    """Test samples marked `structural_overlap` (their nests all seen in train) are left out of the
    clean part's scores; the whole split's scores keep them."""
    from flows.storage import write_shard

    lake = tmp_path / "lake"
    write_shard(lake, "programs", "p", [{"program_id": "p1", "signature": json.dumps(SIG), "leir": MATMUL}])
    write_shard(lake, "steps", "s", [{"step_id": f"s{i}", "program_id": "p1", "before_leir": MATMUL,
                                      "after_leir": REORDERED, "strategy": "loop_reorder"} for i in (1, 2, 3)])
    single = prompt(parse_program(MATMUL), MATMUL_SIG)
    write_shard(lake, "samples", "x", [
        {"sample_id": f"t{i}", "split": "test", "prompt": single, "answer": "", "step_ids": f'["s{i}"]',
         "structural_overlap": i != 3} for i in (1, 2, 3)])
    preds = tmp_path / "preds.jsonl"
    preds.write_text("\n".join(json.dumps({"sample_id": f"t{i}", "response": answer(REORDERED if i < 3 else "x")})
                               for i in (1, 2, 3)) + "\n")
    args = ("--split", "test", "--predictions", str(preds), "--lake", str(lake), "--no-time", "--workers", "1")
    rows = run_eval(runner, *args, "--json")
    last = rows.pop()
    assert last["summary"]["n"] == 3 and last["summary"]["close_pass"] == round(2 / 3, 6)
    assert last["summary_clean"]["n"] == 1 and last["summary_clean"]["close_pass"] == 0.0  # t3 alone, wrong
    table = runner.invoke(app, ["eval", *args])
    assert table.exit_code == 0 and "clean part (1)" in table.stdout and "whole split (3)" in table.stdout


# --- the published release ------------------------------------------------------------------------

def test_published_sample_is_re_verified_per_strategy(runner):
    rows = run_eval(runner, "--published", str(DATA / "published_sample.jsonl"), "--json", "--no-time",
                    "--workers", "2")
    last = rows.pop()
    assert [r["status"] for r in rows] == ["exact", "close", "exact", "close", "exact", "mismatch", "mismatch",
                                           "build_error", "exact", "exact"]
    assert rows[8]["require_num_pass"] and rows[8]["detail"]["requested"] == {"count": 2, "at_least": True}
    assert not rows[9]["strategy_label_pass"]  # the published 44th strategy is not one of ours
    assert last["summary"]["n"] == 10
    assert last["by_strategy"]["loop_reorder"] == {"exact": 3, "close": 0, "wrong": 1, "total": 4}
    assert last["by_strategy"]["reduction_factorization"] == {"exact": 0, "close": 1, "wrong": 0, "total": 1}
    assert last["by_strategy"]["loop_split"]["wrong"] == 1


def test_published_prompt_gives_program_and_signature():
    first = json.loads((DATA / "published_sample.jsonl").read_text().splitlines()[4])["messages"][0]["content"]
    text, program = program_from_prompt(first)
    sig = signature_from_prompt(first, program)
    assert text.startswith("B^{4}_{tx=0}")
    assert [(t.name, t.role) for t in sig.tensors] == [("A", "input"), ("C", "output"), ("D", "input"),
                                                         ("E", "input")]  # the output stated second


def test_our_own_prompt_wording_round_trips():
    text = prompt(parse_program(MATMUL), MATMUL_SIG)
    _, program = program_from_prompt(text)
    assert signature_from_prompt(text, program) == MATMUL_SIG
    one = "are and 'A' with the dtype torch.float32 and shape torch.Size([])."
    assert tensors_from_prompt(one) == [("A", "float32", [])]


def test_tensor_wording_is_read_strictly():
    ok = ("'A' with the dtype torch.float16 and shape torch.Size([2, 3]), 'C' with the dtype torch.int64 and shape "
          "torch.Size([3]), and 'D' with the dtype torch.float16 and shape torch.Size([2])")
    assert [n for n, _, _ in tensors_from_prompt(ok)] == ["A", "C", "D"]
    with pytest.raises(PublishedFormatError, match="unexpected text"):
        tensors_from_prompt(ok.replace(", 'C'", "; also 'C'"))
    with pytest.raises(PublishedFormatError, match="no known tensors"):
        tensors_from_prompt("'A' with dtype float32")
    with pytest.raises(PublishedFormatError, match="no LEIR program"):
        program_from_prompt("Give the following IR of x: 'B^{4}_{tx=0}[', where")


# --- the response reader --------------------------------------------------------------------------

BODY = json.dumps({"transformed_IR": REORDERED, "applied_strategy": "loop_reorder"})


@pytest.mark.parametrize("text", [
    f"<think>r</think><answer>{BODY}</answer>",
    f"  \n<think>\nr\n</think>\n\n<answer>\n{BODY}\n</answer>\n",
    f"```\n<think>r</think><answer>{BODY}</answer>\n```",
    f"<think>r</think><answer>```json\n{BODY}\n```</answer>",
])
def test_layout_is_lenient(text):
    parsed = parse_response(text)
    assert not parsed.multi and parsed.items[0].transformed_ir == REORDERED


@pytest.mark.parametrize("text, message", [
    (f"Sure! <think>r</think><answer>{BODY}</answer>", "must start with <think>"),
    (f"<think>r</think><answer>{BODY}</answer> hope this helps", "text after </answer>"),
    (f"<think>r<answer>{BODY}</answer>", "not closed by </think>"),
    (BODY, "must start with <think>"),
    ("<think>r</think><answer>{'transformed_IR': 'x', 'applied_strategy': 'y'}</answer>", "not JSON"),
    ('<think>r</think><answer>{"transformed_IR": 3, "applied_strategy": "y"}</answer>', "must be strings"),
    ('<think>r</think><answer>{"transformed_IR": "x"}</answer>', "missing applied_strategy"),
    ('<think>r</think><answer>[{"transformed_IR": "x", "applied_strategy": "y"}]</answer>', "missing idx"),
    ('<think>r</think><answer>[]</answer>', "empty"),
    ('<think>r</think><answer>"x"</answer>', "expected an object or a list"),
])
def test_content_is_strict(text, message):
    with pytest.raises(ResponseError, match=message) as info:
        parse_response(text)
    assert info.value.kind == "format_error"


def test_bare_json_and_the_published_key_only_when_asked():
    published = json.dumps({"transformed_IR": "x", "applied_strategies": "loop_split"})
    parsed = parse_response(published, bare_json=True, strategy_keys=("applied_strategy", "applied_strategies"))
    assert parsed.items[0].strategy == "loop_split"
    with pytest.raises(ResponseError):
        parse_response(published, bare_json=True)


def test_requested_answers_from_the_wording():
    assert requested_answers(TASK_MULTI.format(k=4)) == Requested(4)
    assert requested_answers("Please give me at least 3 different **numerically") == Requested(3, at_least=True)
    assert requested_answers(prompt(parse_program(MATMUL), MATMUL_SIG)) is None
    assert Requested(3, at_least=True).satisfied_by(5) and not Requested(3).satisfied_by(5)
