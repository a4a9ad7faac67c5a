"""Search with real TVM verification and timing (search.runner), the llm policy through a local
OpenAI-compatible server, the CLI contract, and the lake rows of a trajectory."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest
from typer.testing import CliRunner

from cli.main import app
from flows.search import trajectory_rows
from flows.storage import to_arrow
from leir.canon import program_id
from leir.parse import parse_program
from leir.signature import Signature
from search.drivers import Budget, DriverConfig
from search.runner import Pools, SearchSettings, run_search

MM_SIG = {"tensors": [
    {"name": "A", "shape": [64, 64], "dtype": "float32", "role": "input"},
    {"name": "C", "shape": [64, 64], "dtype": "float32", "role": "input"},
    {"name": "D", "shape": [64, 64], "dtype": "float32", "role": "output"}]}
MATMUL = "L^{64}_{b=0}L^{64}_{a=0}L^{64}_{c=0}[D^{f32,g}_{b,a}=D^{f32,g}_{b,a}+A^{f32,g}_{b,c}*C^{f32,g}_{c,a};];"
SM_SIG = {"tensors": [
    {"name": "A", "shape": [64, 256], "dtype": "float32", "role": "input"},
    {"name": "C", "shape": [64, 256], "dtype": "float32", "role": "output"}]}
SOFTMAX = ("L^{64}_{b=0}L^{256}_{a=0}[D^{f32,g}_{b}=max(D^{f32,g}_{b},A^{f32,g}_{b,a});];"
           "L^{64}_{b=0}L^{256}_{a=0}[E^{f32,g}_{b}=E^{f32,g}_{b}+exp(A^{f32,g}_{b,a}-D^{f32,g}_{b});];"
           "L^{64}_{b=0}L^{256}_{a=0}[C^{f32,g}_{b,a}=exp(A^{f32,g}_{b,a}-D^{f32,g}_{b})/E^{f32,g}_{b};];")
SMALL = DriverConfig(depth=3, branching=3, width=2, iterations=8)


@pytest.fixture(scope="module")
def pools():
    with Pools(workers=2, timeout_s=60) as p:
        yield p


@pytest.mark.timing
def test_greedy_matmul_speedup_is_re_measurable(pools):
    from gpu_tasks.timing import time_pair

    result = run_search(MATMUL, MM_SIG, "greedy", budget=6, pools=pools, config=DriverConfig(depth=2, branching=4))
    assert result["states_verified"] <= 6
    assert result["best_speedup"] > 1.5  # a reorder that makes the inner loop stride-1 alone does this
    best = result["trajectory"][-1]
    assert best["leir"] == result["best_leir"] and best["status"] in ("exact", "close")
    again = time_pair(MATMUL, result["best_leir"], Signature.from_json(MM_SIG), pool=pools.timing, repeats=5,
                      min_repeat_ms=20)
    assert again.status == "ok" and again.speedup > 1.0  # the state found really is faster
    # The same measurement again agrees in magnitude: a wrong program timed, or before and after
    # swapped, would be off by far more. The bound is loose on purpose: the search times with fewer
    # repeats, and a 250 us kernel on a shared 2-core machine was seen to re-measure 3.1x as 4.5x.
    assert 0.5 <= again.speedup / result["best_speedup"] <= 2.0


def test_beam_softmax_every_state_checked_against_the_root(pools):
    result = run_search(SOFTMAX, SM_SIG, "beam", budget=5, pools=pools, config=SMALL, as_result=True)
    assert result.states_verified <= 5
    assert all(n.status in ("exact", "close") for n in result.trajectory)
    assert result.best.speedup >= 1.0
    steps, row = trajectory_rows(result, program_id(result.root.program, Signature.from_json(SM_SIG)),
                                 Signature.from_json(SM_SIG))
    assert [s["depth"] for s in steps] == list(range(len(steps)))
    assert all(s["parent_step_id"] == (steps[i - 1]["step_id"] if i else None) for i, s in enumerate(steps))
    assert json.loads(row["steps"]) == [s["step_id"] for s in steps]
    to_arrow("trajectories", [row])
    to_arrow("steps", steps)


# --- llm policy through a local server --------------------------------------------------------------

class _Handler(BaseHTTPRequestHandler):
    reply = ""
    requests: list = []

    def do_POST(self):  # noqa: N802 (http.server's name)
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "auth": self.headers.get("Authorization"), "body": body})
        out = json.dumps({"choices": [{"message": {"role": "assistant", "content": type(self).reply}}]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


@pytest.fixture()
def llm_server():
    parallel = MATMUL.replace("L^{64}_{b=0}", "P^{64}_{b=0}", 1)
    items = [{"idx": 1, "transformed_IR": parallel, "applied_strategy": "loop_parallelization"},
             {"idx": 2, "transformed_IR": "L^{4}_{b=0}[os.system('x')];", "applied_strategy": "loop_split"},
             {"idx": 3, "transformed_IR": MATMUL.replace("D^", "Q^"), "applied_strategy": "loop_split"},
             {"idx": 4, "transformed_IR": parallel, "applied_strategy": "go_faster"}]
    _Handler.reply = "```\n<think>parallelise the rows</think>\n<answer>" + json.dumps(items) + "</answer>\n```"
    _Handler.requests = []
    server = HTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_llm_policy_through_local_server(pools, llm_server, monkeypatch):
    monkeypatch.setenv("STEPTP_LLM_BASE_URL", llm_server)
    monkeypatch.setenv("STEPTP_LLM_MODEL", "local-test")
    monkeypatch.setenv("STEPTP_LLM_API_KEY", "sk-test")
    result = run_search(MATMUL, MM_SIG, "chain", "llm", budget=3, pools=pools,
                        config=DriverConfig(depth=1, branching=4), policy_options={"proposals": 4})
    request = _Handler.requests[0]
    assert request["path"] == "/v1/chat/completions" and request["auth"] == "Bearer sk-test"
    assert request["body"]["model"] == "local-test"
    content = request["body"]["messages"][0]["content"]
    assert "LEIR" in content and "'A' with the dtype torch.float32" in content and "search depth 0" in content
    # the whole reply is rejected by the guards (code in an IR), so nothing is verified
    assert result["states_verified"] == 0 and result["rejections"]
    assert "injection" in result["rejections"][0]["reason"]


def test_llm_policy_rejects_bad_items(pools, llm_server, monkeypatch):
    parallel = MATMUL.replace("L^{64}_{b=0}", "P^{64}_{b=0}", 1)
    items = [{"idx": 1, "transformed_IR": "not leir {", "applied_strategy": "loop_split"},
             {"idx": 2, "transformed_IR": MATMUL.replace("D^", "Q^"), "applied_strategy": "loop_split"},
             {"idx": 3, "transformed_IR": parallel, "applied_strategy": "go_faster"},
             {"idx": 4, "transformed_IR": parallel, "applied_strategy": "loop_parallelization"}]
    _Handler.reply = "<think>t</think><answer>" + json.dumps(items) + "</answer>"
    result = run_search(MATMUL, MM_SIG, "chain", "llm", budget=3, pools=pools,
                        config=DriverConfig(depth=1, branching=4),
                        policy_options={"base_url": llm_server, "model": "m", "api_key": "", "proposals": 4})
    assert result["states_verified"] == 1
    state = result["states"][1]  # the root is states[0]; the trajectory holds it only if it is faster
    assert state["strategy"] == "loop_parallelization" and state["status"] == "exact"
    assert all(t["source"] == "llm" for t in result["trajectory"])
    reasons = [r["reason"] for r in result["rejections"]]
    assert len(reasons) == 3 and "not LEIR" in reasons[0] and "invalid LEIR" in reasons[1]
    assert "unknown strategy" in reasons[2]


# --- CLI --------------------------------------------------------------------------------------------

def test_cli_search_json_contract(tmp_path):
    (tmp_path / "p.leir").write_text(MATMUL + "\n")
    (tmp_path / "sig.json").write_text(json.dumps(MM_SIG))
    out = CliRunner().invoke(app, ["search", "--driver", "chain", "--signature", str(tmp_path / "sig.json"),
                                   str(tmp_path / "p.leir"), "--budget", "2", "--seed", "1", "--json"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.stdout)
    assert {"best_speedup", "best_leir", "trajectory", "states_verified", "wall_s"} <= set(data)
    assert data["states_verified"] <= 2
    for step in data["trajectory"]:
        assert {"strategy", "params", "leir", "status", "speedup"} <= set(step)
        parse_program(step["leir"])


def test_cli_search_bad_usage(tmp_path):
    (tmp_path / "p.leir").write_text("L^{4}_{")
    (tmp_path / "sig.json").write_text(json.dumps(MM_SIG))
    out = CliRunner().invoke(app, ["search", "--signature", str(tmp_path / "sig.json"), str(tmp_path / "p.leir")])
    assert out.exit_code == 2


def test_budget_object_and_settings(pools):
    result = run_search(MATMUL, MM_SIG, "dfs", budget=Budget(states=2, wall_s=120), pools=pools,
                        config=SMALL, settings=SearchSettings(repeats=3, min_repeat_ms=5))
    assert result["states_verified"] == 2 and result["stopped"] == "states"


@pytest.mark.timing
def test_default_beam_on_the_published_matmul_reaches_parallel_unit_stride_vector_code(pools):
    """Issue 27's command with real verification and timing (structure, not time): the B-form
    matmul 128^3, beam, library policy ranked (defaults), seed 1; a small budget. Marked `timing`:
    the beam keeps the states its clock ranks first, and a starved clock ranks parallel states last."""
    from test_search_drivers import MM128, SIG128, parallel_and_unit_stride_vector

    result = run_search(MM128, SIG128, "beam", budget=12, seed=1, pools=pools, as_result=True,
                        policy_options={"ranked": True})
    reached = [n for n in result.nodes if n.accepted and parallel_and_unit_stride_vector(n.program)]
    assert reached, [n.action.strategy for n in result.nodes[1:]]
    assert all(n.status in ("exact", "close") for n in reached[0].path())   # every step on the way verified
    # the pool's two workers verified states side by side, and the search used verdicts kept that way
    assert result.verified_ahead > 0 and 0 < result.used_ahead <= result.verified_ahead
