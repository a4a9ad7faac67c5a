"""The `steptp verify` and `steptp time` contract: one JSON line per input, in order; malformed lines
are `invalid`; exit status 0 / 1 / 2; never a traceback."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app
from tests.gpu_tasks.conftest import MATMUL, MATMUL_REORDERED, MATMUL_SIG, MATMUL_WRONG

SIG = MATMUL_SIG.to_json()
KEYS = ["id", "status", "max_abs_err", "max_rel_err", "rel_l2_err", "draws", "error"]


def pair(pair_id, after, before=MATMUL, sig=SIG) -> str:
    return json.dumps({"id": pair_id, "signature": sig, "before": before, "after": after})


@pytest.fixture
def runner():
    return CliRunner()


def rows(output: str) -> list[dict]:
    return [json.loads(line) for line in output.splitlines()]


def test_batch_keeps_input_order_and_reports_malformed_lines(runner, tmp_path):
    batch = tmp_path / "pairs.jsonl"
    batch.write_text("\n".join([
        pair("same", MATMUL),
        "{not json",
        json.dumps({"id": "no-after", "signature": SIG, "before": MATMUL}),
        pair("wrong", MATMUL_WRONG),
        "",
        pair("syntax", MATMUL.replace("];", "]")),
        json.dumps([1, 2]),
        pair("reordered", MATMUL_REORDERED),
    ]) + "\n")
    result = runner.invoke(app, ["verify", "--batch", str(batch), "--workers", "2"])
    assert result.exit_code == 1, result.output
    out = rows(result.stdout)
    assert [r["id"] for r in out] == ["same", None, "no-after", "wrong", "syntax", None, "reordered"]
    assert [r["status"] for r in out] == ["exact", "invalid", "invalid", "mismatch", "invalid", "invalid", "exact"]
    assert all(list(r) == KEYS for r in out)
    assert out[1]["error"].startswith("line 2: not JSON")
    assert out[2]["error"] == "line 3: missing after"
    assert out[4]["error"].startswith("after: 1:")
    assert out[5]["error"].startswith("line 7: expected an object")
    assert out[0]["draws"] == 3 and out[0]["max_abs_err"] == 0.0
    assert "Traceback" not in result.output


def test_batch_where_every_pair_passes_exits_zero(runner, tmp_path):
    batch = tmp_path / "ok.jsonl"
    batch.write_text(pair(1, MATMUL) + "\n" + pair(2, MATMUL_REORDERED) + "\n")
    result = runner.invoke(app, ["verify", "-b", str(batch), "-j", "1", "--draws", "2"])
    assert result.exit_code == 0, result.output
    assert [(r["id"], r["status"], r["draws"]) for r in rows(result.stdout)] == [(1, "exact", 2), (2, "exact", 2)]


def test_a_tolerance_file_overrides_the_table(runner, tmp_path):
    from tests.gpu_tasks.conftest import MATMUL_REVERSED

    batch = tmp_path / "pairs.jsonl"
    batch.write_text(pair("reversed", MATMUL_REVERSED) + "\n")
    strict = tmp_path / "strict.yaml"
    strict.write_text("float32: {max_abs: 0.0, max_rel: 0.0, rel_l2: 0.0}\n")
    result = runner.invoke(app, ["verify", "-b", str(batch), "-j", "1", "--tolerances", str(strict)])
    assert result.exit_code == 1 and rows(result.stdout)[0]["status"] == "mismatch"
    bad = tmp_path / "bad.yaml"
    bad.write_text("float32: {max_abs: 1}\n")
    result = runner.invoke(app, ["verify", "-b", str(batch), "--tolerances", str(bad)])
    assert result.exit_code == 2 and "not a tolerance table" in result.stderr


def test_single_pair_from_files(runner, tmp_path):
    (tmp_path / "sig.json").write_text(json.dumps(SIG))
    (tmp_path / "before.leir").write_text(MATMUL + "\n")
    (tmp_path / "after.leir").write_text(MATMUL_WRONG + "\n")
    result = runner.invoke(app, ["verify", "--signature", str(tmp_path / "sig.json"),
                                 str(tmp_path / "before.leir"), str(tmp_path / "after.leir")])
    assert result.exit_code == 1
    assert rows(result.stdout)[0]["status"] == "mismatch"


@pytest.mark.parametrize("args", [
    ["verify"],
    ["verify", "--batch", "/nonexistent/pairs.jsonl"],
    ["verify", "--signature", "/nonexistent/sig.json", "a", "b"],
    ["verify", "--batch", "x.jsonl", "--signature", "s.json"],
])
def test_usage_errors_exit_two_without_traceback(runner, args):
    result = runner.invoke(app, args)
    assert result.exit_code == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output


def test_help_documents_the_exit_codes(runner):
    result = runner.invoke(app, ["verify", "--help"])
    assert result.exit_code == 0 and "Exit status" in result.stdout and "0 every pair exact or close" in result.stdout


def test_time_batch(runner, tmp_path):
    batch = tmp_path / "pairs.jsonl"
    batch.write_text(pair("t1", MATMUL_REORDERED) + "\nnope\n")
    result = runner.invoke(app, ["time", "--batch", str(batch), "--repeats", "3", "--min-repeat-ms", "1"])
    assert result.exit_code == 1, result.output
    first, second = rows(result.stdout)
    assert first["id"] == "t1" and first["status"] == "ok" and first["before_us"] > 0 and first["speedup"] > 0
    assert first["fingerprint"]["tvm_threads"] >= 1
    assert second["status"] == "invalid" and second["before_us"] is None


@pytest.mark.slow
def test_installed_console_script(tmp_path):
    steptp = Path(sys.executable).with_name("steptp")
    batch = tmp_path / "pairs.jsonl"
    batch.write_text(pair("a", MATMUL) + "\n" + pair("b", MATMUL_WRONG) + "\n")
    proc = subprocess.run([str(steptp), "verify", "--batch", str(batch)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1, proc.stderr
    assert [r["status"] for r in rows(proc.stdout)] == ["exact", "mismatch"]


def test_form_option_reaches_every_request(runner, tmp_path, monkeypatch):
    import gpu_tasks.timing
    import gpu_tasks.verify

    seen = []
    for module, name in ((gpu_tasks.verify, "pair_request"), (gpu_tasks.timing, "timing_request")):
        original = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _f=original, **k: seen.append(k["form"]) or _f(*a, **k))
    batch = tmp_path / "pairs.jsonl"
    batch.write_text(pair("r", MATMUL_REORDERED) + "\n" + pair("w", MATMUL_WRONG) + "\n")
    result = runner.invoke(app, ["verify", "-b", str(batch), "-j", "1", "--form", "tensorir"])
    assert [r["status"] for r in rows(result.stdout)] == ["exact", "mismatch"]
    result = runner.invoke(app, ["time", "-b", str(batch), "--repeats", "3", "--min-repeat-ms", "1",
                                 "--form", "tensorir"])
    assert [r["status"] for r in rows(result.stdout)] == ["ok", "ok"]
    assert seen == ["tensorir"] * 4
    bad = runner.invoke(app, ["verify", "-b", str(batch), "--form", "blocks"])
    assert bad.exit_code == 2 and "Traceback" not in bad.output
