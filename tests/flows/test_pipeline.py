"""The pipeline end to end on the `tiny` profile: every stage, the catalog, the release; determinism,
kill-and-resume and the Dask runner are slow tests."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.config import ROOT, load_params

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    os.environ["PREFECT_LOCAL_STORAGE_PATH"] = str(tmp_path_factory.mktemp("prefect-results"))
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def run_all(lake: Path, reports: Path, profile: str = "tiny", **kw) -> list[dict]:
    from flows.pipeline import STAGES, run_stage

    params = load_params(profile=profile)
    return [run_stage(stage, params, lake, reports, **kw) for stage in STAGES]


def table_bytes(lake: Path) -> dict[str, bytes]:
    tables = ("programs", "steps", "verifications", "samples")
    return {p.relative_to(lake).as_posix(): p.read_bytes() for t in tables for p in sorted((lake / t).glob("*.parquet"))}


@pytest.fixture(scope="module")
def tiny_lake(harness, tmp_path_factory):
    root = tmp_path_factory.mktemp("run")
    results = run_all(root / "lake", root / "reports")
    return root, results


def test_every_stage_produces_its_tables_and_the_release(tiny_lake):
    root, results = tiny_lake
    by_stage = {r["stage"]: r for r in results}
    assert by_stage["generate"]["rows"] == 2 and by_stage["transform"]["rows"] > 10
    assert by_stage["verify"]["rows"] == by_stage["transform"]["rows"]
    assert by_stage["filter"]["samples"] > 0 and by_stage["validate"]["expectations"] > 10
    assert by_stage["search"]["rows"] == 4  # 2 programs x 2 drivers of the tiny profile
    search = json.loads((root / "reports" / "search.json").read_text())
    assert set(search["drivers"]) == {"greedy", "mcts"}
    release = Path(by_stage["release"]["path"])
    assert (release / "croissant.json").exists() and (release / "chat" / "train.parquet").exists()
    summary = json.loads((root / "reports" / "summary.json").read_text())
    assert summary["programs_verified"] == 2 and summary["verification_pass_rate"] > 0.9
    assert (root / "reports" / "strategy_distribution.png").stat().st_size > 1000
    gate = json.loads((root / "reports" / "gate.json").read_text())
    assert gate["success"] is True


def test_every_prompt_names_its_programs_target(tiny_lake):
    """one program of the tiny profile is written for the GPU, one for the CPU; every prompt
    about a program's states names that program's target, binding appears only on the GPU program and
    P or V loops only on the CPU one; the GPU program's steps are verified on the CPU (no GPU here)."""
    from flows.reports import prompt_lines
    from flows.storage import read_table

    root, results = tiny_lake
    lake = root / "lake"
    target_of = {p["program_id"]: p["target"] for p in read_table(lake, "programs").to_pylist()}
    assert sorted(target_of.values()) == ["cuda", "llvm"]
    steps = {s["step_id"]: s for s in read_table(lake, "steps").to_pylist()}
    for s in steps.values():
        assert s["strategy"] != "loop_binding" or target_of[s["program_id"]] == "cuda"
        assert s["strategy"] not in ("loop_parallelization", "loop_vectorization") or target_of[s["program_id"]] == "llvm"
        added = {kind: s["after_leir"].count(kind + "^") - s["before_leir"].count(kind + "^") for kind in "BPV"}
        assert added["B"] <= 0 or target_of[s["program_id"]] == "cuda"
        assert max(added["P"], added["V"]) <= 0 or target_of[s["program_id"]] == "llvm"
    assert {s["strategy"] for s in steps.values() if target_of[s["program_id"]] == "cuda"} >= {"loop_binding"}
    device = {"cuda": "will run on a GPU (CUDA):", "llvm": "will run on a CPU (LLVM):"}
    lines_of: dict[str, set] = {}
    for sample in read_table(lake, "samples").to_pylist():
        programs = {steps[i]["program_id"] for i in json.loads(sample["step_ids"])}
        assert len(programs) == 1
        program = programs.pop()
        assert sample["prompt"].split("\n")[0].endswith(device[target_of[program]])
        lines = prompt_lines(sample["prompt"])
        lines_of.setdefault(program, set()).add((lines["target"], lines["known tensors"]))
    # the target and known-tensors lines are the program's: one per program, whatever the strategy, so
    # they say nothing about the label that the program does not
    assert len(lines_of) == 2 and all(len(lines) == 1 for lines in lines_of.values())
    verifications = read_table(lake, "verifications").to_pylist()
    assert {v["target"] for v in verifications} == {"llvm"} and len(verifications) == len(steps)
    verify = next(r for r in results if r["stage"] == "verify")
    assert verify["gpu_program_steps"] == sum(1 for s in steps.values() if target_of[s["program_id"]] == "cuda") > 0


def test_catalog_answers_sql(tiny_lake):
    from flows.storage import connect

    root, _ = tiny_lake
    con = connect(root / "lake")
    rows = con.execute("SELECT strategy, count(*) FROM steps_verified GROUP BY 1 ORDER BY 1").fetchall()
    con.close()
    assert rows and all(n > 0 for _, n in rows)


def test_search_stage_links_trajectories_to_their_steps_and_grounds_every_state(tiny_lake):
    from flows.storage import connect, read_table

    root, _ = tiny_lake
    steps = {r["step_id"]: r for r in read_table(root / "lake", "trajectory_steps").to_pylist()}
    for t in read_table(root / "lake", "trajectories").to_pylist():
        ids, speedups = json.loads(t["steps"]), json.loads(t["speedups"])
        assert len(ids) == len(speedups) == len(json.loads(t["times_us"])) and t["search_states"] <= 3  # the budget
        for depth, (step_id, parent) in enumerate(zip(ids, [None, *ids], strict=False)):  # depth 0: on the root
            assert steps[step_id]["parent_step_id"] == parent and steps[step_id]["depth"] == depth
            assert steps[step_id]["program_id"] == t["program_id"]
        # every state verified against the original and timed after the search, in one session
        assert all(v in ("exact", "close") for v in json.loads(t["verification"])) and t["root_us"] > 0
        lows, highs = json.loads(t["speedups_low"]), json.loads(t["speedups_high"])
        for sp, lo, hi in zip(speedups, lows, highs, strict=True):
            assert lo <= sp <= hi
        assert t["best_speedup"] == pytest.approx(max([1.0, *speedups]))
        assert set(json.loads(t["step_effects"])) <= {"faster", "neutral", "slower", "unresolved"}
    con = connect(root / "lake")
    n_single, n_all = (con.execute(f"SELECT count(*) FROM {v}").fetchone()[0] for v in ("steps", "steps_all"))
    con.close()
    assert n_all == n_single + len(steps)
    refs = json.loads((root / "reports" / "search.json").read_text())["references"]
    searched = sorted({t["program_id"] for t in read_table(root / "lake", "trajectories").to_pylist()})
    assert sorted(r["program_id"] for r in refs) == searched  # PyTorch eager on every searched program
    assert all(r["error"] is None and r["torch_eager_us"] > 0 for r in refs)
    # timed again in a second fresh process; the verdict is in the row (the tiny profile compiles nothing)
    assert all(r["torch_eager_recheck_us"][0] > 0 and (r["torch_eager_check"] == "ok" or
                                                   r["torch_eager_check"].startswith("refused: ")) for r in refs)
    assert all(r["torch_compile_us"] is None for r in refs)
    assert all(r["metaschedule_us"] is None for r in refs)  # the tiny profile skips tuning (metaschedule_trials: 0)


def test_every_released_trajectory_replays_with_steptp_apply_byte_for_byte(tiny_lake, tmp_path):
    import pyarrow.parquet as pq
    from typer.testing import CliRunner

    from cli.main import app
    from flows.storage import read_table

    root, results = tiny_lake
    release = Path(next(r for r in results if r["stage"] == "release")["path"])
    sigs = {p["program_id"]: p["signature"] for p in read_table(root / "lake", "programs").to_pylist()}
    trajectories = [t for c in ("trajectories", "trajectories_fast_exp")
                    for f in sorted((release / c).glob("*.parquet")) for t in pq.read_table(f).to_pylist()]
    assert trajectories and sum(t["steps"] for t in trajectories) > 0
    (tmp_path / "sig.json").write_text("{}")
    for t in trajectories:
        (tmp_path / "sig.json").write_text(sigs[t["program_id"]])
        assert len(t["verification"]) == len(t["strategies"]) == len(t["times_us"]) - 1 == len(t["states"]) - 1
        for k, (strategy, site, params) in enumerate(zip(t["strategies"], t["sites"], t["params"], strict=True)):
            (tmp_path / "state.leir").write_text(t["states"][k])
            result = CliRunner().invoke(app, ["apply", strategy, str(tmp_path / "state.leir"), "-s",
                                              str(tmp_path / "sig.json"), "--no-cot", "--site", site, "--params", params])
            assert result.exit_code == 0, (t["trajectory_id"], k, result.output)
            [line] = [json.loads(x) for x in result.stdout.splitlines()]
            assert line["after"] == t["states"][k + 1]


# --- the released CoTs: no claim the step does not bring on the prompt's target ------------

PARALLEL_CLAIMS = ("run in parallel", "runs in parallel", "separate cores", "at once")
MEMORY_CLAIMS = ("fast memory", "on chip", "on-chip", "shared by a block")


def released_cots(root: Path) -> list[dict]:
    """One row per option of every released sample: strategy, target, think text, the step's params."""
    from flows.reports import thoughts
    from flows.storage import read_table

    steps = {r["step_id"]: r for r in read_table(root / "lake", "steps").to_pylist()}
    rows = []
    for sample in read_table(root / "lake", "samples").to_pylist():
        target = "cuda" if "a GPU (CUDA)" in sample["prompt"].splitlines()[0] else "llvm"
        ids = json.loads(sample["step_ids"])
        for step_id, (strategy, text) in zip(ids, thoughts(sample["answer"], json.loads(sample["strategies"])),
                                             strict=True):
            rows.append({"strategy": strategy, "target": target, "think": text,
                         "params": json.loads(steps[step_id]["params"])})
    return rows


def parallel_loops(think: str, part: str, target: str) -> int:
    """Loops of the quoted nests after `part` ("Before:"/"After:") that run in parallel on `target`:
    P loops not inside another P on the CPU, B loops on the GPU."""
    from leir.analysis import iter_nests
    from leir.parse import parse_program

    lines = think.splitlines()
    start = lines.index(part) if part in lines else next(i for i, x in enumerate(lines) if x.startswith(part))
    count = 0
    for line in lines[start + 1:]:
        if not line.startswith("  nest "):
            break
        for nest, outer in iter_nests(parse_program(line.split(": ", 1)[1])):
            for k, lp in enumerate(nest.loops):
                inside_p = any(x.kind == "P" for x in outer + nest.loops[:k])
                count += lp.kind == "B" if target == "cuda" else (lp.kind == "P" and not inside_p)
    return count


def claims_parallelism(line: str) -> bool:
    """A line that says the step makes work run in parallel (a raised parallel extent included)."""
    import re

    low = line.lower()
    raised = [(int(a), int(b)) for a, b in re.findall(r"parallel extent (\d+) -> (\d+)", low)]
    return any(c in low for c in PARALLEL_CLAIMS) or "raises the parallel extent" in low or any(b > a for a, b in raised)


def test_no_released_cot_claims_parallelism_its_loops_do_not_have(tiny_lake):
    root, _ = tiny_lake
    checked = 0
    for row in released_cots(root):
        claims = [x for x in row["think"].splitlines() if x.startswith(("Why ", "Strategy: ", "Expected change"))]
        before = parallel_loops(row["think"], "Before:", row["target"])
        after = parallel_loops(row["think"], "After:", row["target"])
        if any(claims_parallelism(x) for x in claims):
            assert after > before, row["think"]
            checked += 1
        elif row["strategy"] == "reduction_factorization" and row["target"] == "llvm":
            # partials in serial loops on the CPU: no claim, and none due (on a GPU program the
            # combining nest is a bound nest of its own, counted as one more bound loop)
            assert after <= before
    assert checked > 0  # loop_parallelization steps are released on the tiny profile


def test_no_released_cot_claims_a_memory_benefit_of_a_scope_on_the_cpu(tiny_lake):
    root, _ = tiny_lake
    rows = released_cots(root)
    for row in rows:
        scoped = row["strategy"] == "set_storage_scope" or (row["strategy"] == "cache_read_write"
                                                            and "read" in row["params"])
        if row["target"] == "llvm" and scoped:
            assert not any(c in row["think"].lower() for c in MEMORY_CLAIMS), row["think"]
            assert "no memory benefit" in row["think"] or "register" in row["think"], row["think"]
    assert all(x["think"].startswith("Now: ") for x in rows)  # every released CoT reasons before the step


def test_the_cot_template_report_counts_the_released_cots(tiny_lake):
    root, _ = tiny_lake
    report = json.loads((root / "reports" / "cot_templates.json").read_text())
    rows = released_cots(root)
    assert report["cots"] == len(rows) and report["cots"] == sum(v["cots"] for v in report["strategies"].values())
    assert len(report["strategies"]) == 43
    assert all(min(v["cots"], 1) <= v["templates"] <= v["cots"] for v in report["strategies"].values())
    summary = json.loads((root / "reports" / "summary.json").read_text())
    assert summary["cot_templates_median"] == report["median_templates"]


def test_rerun_reuses_finished_work_and_changes_nothing(tiny_lake):
    root, _ = tiny_lake
    before = table_bytes(root / "lake")
    results = run_all(root / "lake", root / "reports")
    assert table_bytes(root / "lake") == before
    assert results[-1].get("unchanged") is True  # the same release again is recognised, not rewritten


def test_changed_data_under_the_same_version_makes_a_development_release(tiny_lake, tmp_path, monkeypatch):
    """Issue 28, finding 7: the data changed and release.version did not (a workload added, `make run`
    again). The default build writes a development release beside the published one, never over it;
    the same again changes nothing; the same data with another card (new code) rewrites the development
    release, never the published one; a version asked for explicitly is refused; a new version publishes."""
    import shutil

    from flows.pipeline import run_stage
    from flows.storage import read_table, write_shard
    from flows.versions import DEV_VERSION, ReleaseError

    root, _ = tiny_lake
    lake, reports = tmp_path / "lake", tmp_path / "reports"
    shutil.copytree(root / "lake", lake, ignore=shutil.ignore_patterns(".prefect-results"))
    shutil.copytree(root / "reports", reports)
    params = load_params(profile="tiny")
    published = lake / "releases" / f"v{params.release['version']}"
    before = {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()}
    samples = read_table(lake, "samples").to_pylist()
    for shard in (lake / "samples").glob("*.parquet"):
        shard.unlink()
    write_shard(lake, "samples", "all", samples[1:])  # the data changed: one sample fewer
    first = run_stage("release", params, lake, reports)
    dev = first["version"]
    assert DEV_VERSION.match(dev) and dev.startswith("0.1.1-dev+") and first["development_of"] == "0.1.0"
    assert {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()} == before
    card = (lake / "releases" / f"v{dev}" / "README.md").read_text()
    assert f"# Step-TP rebuilt, v{dev}" in card and "## Development release" in card
    again = run_stage("release", params, lake, reports)
    assert again["version"] == dev and again["unchanged"] is True
    assert sorted(p.name for p in (lake / "releases").iterdir()) == ["v0.1.0", f"v{dev}"]
    import flows.release

    written = flows.release.card
    monkeypatch.setattr(flows.release, "card", lambda *a, **k: written(*a, **k) + "\nA sentence of new code.\n")
    rewritten = run_stage("release", params, lake, reports)
    assert rewritten["version"] == dev and rewritten.get("rewritten") is True
    assert (lake / "releases" / f"v{dev}" / "README.md").read_text().endswith("A sentence of new code.\n")
    assert sorted(p.name for p in (lake / "releases").iterdir()) == ["v0.1.0", f"v{dev}"]
    assert {p.relative_to(published): p.read_bytes() for p in published.rglob("*") if p.is_file()} == before
    monkeypatch.setattr(flows.release, "card", written)
    with pytest.raises(ReleaseError, match="exists with other contents"):
        run_stage("release", params, lake, reports, version="0.1.0")
    bumped = load_params(profile="tiny", overrides={"release": {"version": "0.2.0"}})
    assert run_stage("release", bumped, lake, reports)["version"] == "0.2.0"
    log = (lake / "releases" / "v0.2.0" / "CHANGELOG.md").read_text()
    assert "previous release: v0.1.0" in log and "dev" not in log  # a development release is not published


def test_a_damaged_release_is_listed_as_damaged_and_never_compared_against(tiny_lake, tmp_path):
    """A release folder missing a file or holding other bytes than its Croissant metadata lists (what a
    second writer deleting the first one's folder left before writers had names of their own) is shown
    as damaged by `lake status`, and the release stage refuses it with the way out, not a traceback."""
    import shutil

    from typer.testing import CliRunner

    from cli.main import app
    from flows.lake_guard import release_problems
    from flows.pipeline import run_stage
    from flows.versions import ReleaseError

    root, _ = tiny_lake
    lake = tmp_path / "lake"
    shutil.copytree(root / "lake", lake, ignore=shutil.ignore_patterns(".prefect-results"))
    params = load_params(profile="tiny")
    name = f"v{params.release['version']}"
    assert release_problems(root / "lake" / "releases" / name) == []
    (lake / "releases" / name / "CHANGELOG.md").unlink()
    (lake / "releases" / name / "data" / "train.parquet").write_bytes(b"half a file")
    status = CliRunner().invoke(app, ["lake", "status", "--lake", str(lake), "--json"])
    assert status.exit_code == 1, status.output
    assert json.loads(status.output)["damaged_releases"] == {
        name: ["missing CHANGELOG.md", "1 file(s) differ from their sha256: data/train.parquet"]}
    table = CliRunner().invoke(app, ["lake", "status", "--lake", str(lake)])
    assert f"{name} (DAMAGED)" in table.output and "move it out of the lake" in table.output
    with pytest.raises(ReleaseError, match=f"releases/{name} is damaged .*move it out of the lake"):
        run_stage("release", params, lake, root / "reports")


def test_measure_stage_times_every_released_state_once_with_five_rounds_at_least(tiny_lake):
    from flows.lake_queries import released_step_rows
    from flows.measure import measure_params, passing_follow_ups, state_ids
    from flows.pipeline import run_stage
    from flows.storage import read_table

    root, results = tiny_lake
    lake = root / "lake"
    measured = next(r for r in results if r["stage"] == "measure")
    after_of = {s["step_id"]: s["after_program_id"] for s in read_table(lake, "steps").to_pylist()}
    target_of = {p["program_id"]: p["target"] for p in read_table(lake, "programs").to_pylist()}
    released = released_step_rows(lake)
    wanted = {x for s in released if target_of[s["program_id"]] == "llvm" for x in state_ids(s, after_of)}
    wanted |= {f["after_program_id"] for f in passing_follow_ups(lake, released) if target_of[f["program_id"]] == "llvm"}
    on_gpu = {x for s in released if target_of[s["program_id"]] == "cuda" for x in state_ids(s, after_of)}
    rows = read_table(lake, "timings").to_pylist()
    nest = [r for r in rows if r["unit"] == "nest"]
    assert {r["state_id"] for r in nest} == wanted and len(nest) == len(wanted) == measured["states"]
    assert on_gpu and not on_gpu & wanted  # a GPU program's states are never timed on the CPU
    cfg = measure_params(load_params(profile="tiny"))
    for r in rows:
        assert r["status"] == "ok" and r["time_us"] > 0 and r["rounds"] == len(r["samples_us"]) >= 5
        assert json.loads(r["machine"])["cpu_model"] and r["machine_id"] == measured["machine_id"]
        assert json.loads(r["protocol"])["min_rounds"] == cfg["min_rounds"] == 5 and r["session_id"]
    assert {r["state_id"] for r in rows if r["unit"] == "state"} <= wanted  # timed whole as well: a subset
    effects = read_table(lake, "effects").to_pylist()
    cpu_steps = {s["step_id"] for s in released if target_of[s["program_id"]] == "llvm"}
    assert {e["step_id"] for e in effects if e["kind"] == "step"} == cpu_steps
    assert all(e["effect"] in ("faster", "neutral", "slower", "unresolved") for e in effects)
    again = run_stage("measure", load_params(profile="tiny"), lake, root / "reports")
    assert again["states_timed"] == 0 and again["states_reused"] == len(wanted)  # once per machine
    assert read_table(lake, "timings").to_pylist() == rows


def test_release_has_the_configs_made_of_measurements(tiny_lake):
    import pyarrow.parquet as pq

    from flows.lake_queries import released_ids
    from flows.storage import read_table

    root, results = tiny_lake
    release = Path(next(r for r in results if r["stage"] == "release")["path"])

    def config(name):
        return [r for f in sorted((release / name).glob("*.parquet")) for r in pq.read_table(f).to_pylist()]

    measured, on_gpu = config("measured"), config("gpu_steps")
    # every released step is in one of the two: `measured` the CPU programs' (timed), `gpu_steps` the others'
    assert sorted(r["step_id"] for r in measured + on_gpu) == released_ids(root / "lake")
    target_of = {p["program_id"]: p["target"] for p in read_table(root / "lake", "programs").to_pylist()}
    on_cpu = [r for r in measured if target_of[r["program_id"]] == "llvm"]
    assert len(on_cpu) == len(measured) and all(target_of[r["program_id"]] == "cuda" for r in on_gpu)
    assert on_cpu and all(r["effect"] in ("faster", "neutral", "slower", "unresolved") and r["before_us"] > 0
                          and r["after_us"] > 0 and r["site"] and r["claim"] in ("benefit", "enabling", "none")
                          for r in on_cpu)
    for r in on_cpu:
        if r["effect"] != "unresolved" or r["speedup_low"] is not None:
            assert r["speedup_low"] <= r["speedup"] <= r["speedup_high"]
        if r["claim"] == "enabling":
            assert r["chain_step_id"] is None or r["chain_speedup"] > 0
    # a GPU program's effect stays unmeasured until it is timed on a GPU, and the card says so
    assert on_gpu and all(r["before_us"] is r["after_us"] is r["effect"] is r["speedup"] is None for r in on_gpu)
    assert all(r["site"] and r["claim"] in ("benefit", "enabling", "none") for r in on_gpu)  # the record is kept
    card = (release / "README.md").read_text()
    assert f"{len(on_gpu)} released steps belong to programs written for a GPU" in card
    assert "| `gpu_steps` |" in card
    by_step = {r["step_id"]: r for r in measured}
    for r in config("sft"):  # SFT chosen by measurement: nothing slower, no dead end
        assert r["effect"] == "faster" or r["chain_effect"] == "faster"
        assert r["step_effect"] != "slower"  # not even as the first step of a chain that pays
        assert r["claim"] != "none"  # its chain of thought gives a reason to make the step
        if r["kind"] == "chain":  # the follow-up adds speed to what the step gives alone
            first = by_step[json.loads(r["step_ids"])[0]]
            assert first["chain_speedup_low"] > first["speedup_high"]
        assert all(by_step[i]["dead_end"] is not True for i in json.loads(r["step_ids"])[:1])
    pairs = config("preference")
    for p in pairs:  # chosen faster than the unmodified program and than the rejected, beyond the intervals
        chosen, rejected = by_step[p["chosen_step_id"]], by_step[p["rejected_step_id"]]
        assert chosen["effect"] == "faster" and chosen["speedup_low"] > rejected["speedup_high"]
        assert p["chosen"] != p["rejected"]
    chat = config("preference_chat")
    assert len(chat) == len(pairs)
    for c in chat:
        assert [m["role"] for m in c["prompt"]] == ["user"] and [m["role"] for m in c["chosen"]] == ["assistant"]
    trajectories = config("trajectories") + config("trajectories_fast_exp")
    assert len(trajectories) == read_table(root / "lake", "trajectories").num_rows
    for t in trajectories:
        assert len(t["states"]) == len(t["strategies"]) + 1 == len(t["times_us"]) == len(t["speedups"])
        assert t["machine_id"] and t["cpu"] and all(v in ("exact", "close") for v in t["verification"])
    assert "## Measured effects" in card and "## Configs: what each is for" in card
    assert ("config_name: sft" in card) == bool(config("sft"))  # a config is listed where it has rows
    assert "A step's effect comes from an interval" in card
    assert (release / "cost_model.json").exists() and (root / "lake" / "cost_model" / "model.json").exists()


@pytest.mark.slow
def test_standard_clients_load_every_config_and_record_set_of_a_fresh_release(tiny_lake, tmp_path, monkeypatch):
    """`datasets.load_dataset(DIR, NAME)` for every config the card lists, mlcroissant for every
    record set of croissant.json, and TRL's own preference-format utilities on `preference`."""
    import datasets
    import mlcroissant as mlc
    import yaml

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    root, results = tiny_lake
    release = Path(next(r for r in results if r["stage"] == "release")["path"])
    header = yaml.safe_load((release / "README.md").read_text().split("---")[1])
    configs = {c["config_name"]: c for c in header["configs"]}
    assert {"default", "chat", "measured", "sft", "preference", "preference_chat", "trajectories"} <= set(configs)
    loaded = {}
    for name, config in configs.items():
        loaded[name] = datasets.load_dataset(str(release), name, cache_dir=str(tmp_path / "cache"))
        for split in (f["split"] for f in config["data_files"]):
            assert loaded[name][split].num_rows > 0
    meta = json.loads((release / "croissant.json").read_text())
    dataset = mlc.Dataset(jsonld=str(release / "croissant.json"))
    for record_set in meta["recordSet"]:
        config, _, split = record_set["@id"].rpartition("_")
        records = list(dataset.records(record_set["@id"]))
        assert len(records) == loaded[config or "default"][split].num_rows > 0
    trl = pytest.importorskip("trl.data_utils")
    preference = loaded["preference"]["train"]
    assert not trl.is_conversational(preference[0])  # the standard (string) preference format
    unpaired = trl.unpair_preference_dataset(preference)  # needs prompt / chosen / rejected
    assert unpaired.num_rows == 2 * preference.num_rows and set(unpaired["label"]) == {True, False}
    assert trl.maybe_extract_prompt(preference[0])["prompt"] == preference[0]["prompt"]
    conversational = loaded["preference_chat"]["train"]  # the form that matches `chat`
    assert trl.is_conversational(conversational[0]) and trl.is_conversational(loaded["sft"]["train"][0])
    assert trl.unpair_preference_dataset(conversational).num_rows == 2 * conversational.num_rows


@pytest.mark.slow
def test_two_clean_runs_are_byte_identical(tiny_lake, tmp_path):
    root, _ = tiny_lake
    run_all(tmp_path / "lake", tmp_path / "reports")
    assert table_bytes(tmp_path / "lake") == table_bytes(root / "lake")


@pytest.mark.slow
def test_dask_runner_gives_the_same_tables(tiny_lake, tmp_path):
    from flows.cluster import dask_runner

    root, _ = tiny_lake
    run_all(tmp_path / "lake", tmp_path / "reports", task_runner=dask_runner())
    assert table_bytes(tmp_path / "lake") == table_bytes(root / "lake")


def test_shard_workers_run_transform_shards_in_processes_with_the_same_steps(tiny_lake, tmp_path):
    from prefect.task_runners import ProcessPoolTaskRunner

    from flows.pipeline import local_runner, run_stage

    root, _ = tiny_lake
    params = load_params(profile="tiny", overrides={"profiles": {"tiny": {"shard_workers": 2}}})
    assert isinstance(local_runner("transform", params), ProcessPoolTaskRunner)
    assert local_runner("verify", params) is None and local_runner("transform", load_params(profile="tiny")) is None
    for stage in ("generate", "transform"):  # a lake of its own: no shard comes from the first run's cache
        run_stage(stage, params, tmp_path / "lake", tmp_path / "reports")
    steps = sorted((tmp_path / "lake" / "steps").glob("*.parquet"))
    assert len(steps) == 2
    assert [p.read_bytes() for p in steps] == [p.read_bytes() for p in sorted((root / "lake" / "steps").glob("*.parquet"))]


@pytest.mark.slow
def test_kill_and_resume(tiny_lake, tmp_path):
    """kill -9 in the middle, run again: it completes, and no table is half-written."""
    root, _ = tiny_lake
    cmd = [str(Path(sys.executable).with_name("steptp")), "run", "--profile", "tiny", "--lake", str(tmp_path / "lake"),
           "--reports", str(tmp_path / "reports")]
    env = dict(os.environ, PREFECT_LOCAL_STORAGE_PATH=str(tmp_path / "results"))
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    deadline = time.monotonic() + 300
    while not list((tmp_path / "lake" / "steps").glob("*.parquet")) and time.monotonic() < deadline:
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not list((tmp_path / "lake").rglob("*.tmp"))
    subprocess.run(cmd, cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    assert table_bytes(tmp_path / "lake") == table_bytes(root / "lake")


def test_schedule_deployment_and_prefect_yaml_agree(harness):
    import inspect

    import yaml

    from flows.nightly import nightly_build

    deployment = nightly_build.to_deployment(name="steptp-nightly", cron="0 3 * * *")
    assert deployment.schedules[0].schedule.cron == "0 3 * * *"
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"][0]
    module, func = spec["entrypoint"].split(":")
    assert (ROOT / module).exists() and func == nightly_build.fn.__name__
    assert set(spec["parameters"]) <= set(inspect.signature(nightly_build.fn).parameters)
    assert spec["schedules"][0]["cron"] == "0 3 * * *"
    assert spec["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}  # as `steptp serve`


def test_adding_a_family_recomputes_only_its_shards(harness, tmp_path, monkeypatch):
    """Incremental builds: a family added to the selection runs its own generate/transform/verify
    shards; the shards of the families already built come from the cache, byte for byte."""
    import flows.generate
    import flows.transform
    import flows.verify
    from flows.pipeline import run_stage

    ran: list[tuple[str, str]] = []
    for module, stage in ((flows.generate, "generate"), (flows.transform, "transform"), (flows.verify, "verify")):
        name = f"{stage}_shard"
        real = getattr(module, name)

        def record(first, *args, _real=real, _stage=stage, **kwargs):
            rows = first.items if _stage == "generate" else first  # a Shard, or the shard's rows
            ran.append((_stage, first.name if _stage == "generate" else rows[0]["program_id"]))
            return _real(first, *args, **kwargs)

        monkeypatch.setattr(module, name, record)

    def build(families):
        params = load_params(profile="tiny", overrides={"profiles": {"tiny": {"families": families}}})
        return [run_stage(s, params, tmp_path / "lake", tmp_path / "reports") for s in ("generate", "transform",
                                                                                         "verify")]

    build(["gemm"])
    gemm = {p.name: p.read_bytes() for p in sorted((tmp_path / "lake").glob("*/gemm.parquet"))}
    first = list(ran)
    ran.clear()
    results = build(["gemm", "softmax"])
    from flows.storage import read_table

    programs = {p["program_id"]: p["family"] for p in read_table(tmp_path / "lake", "programs").to_pylist()}
    assert {stage for stage, _ in first} == {"generate", "transform", "verify"}
    assert ran and all(item == "softmax" or programs.get(item) == "softmax" for _, item in ran), ran
    assert {stage for stage, _ in ran} == {"generate", "transform", "verify"}
    assert {p.name: p.read_bytes() for p in sorted((tmp_path / "lake").glob("*/gemm.parquet"))} == gemm
    assert results[2]["reused"] == len(read_table(tmp_path / "lake", "verifications")) - results[2]["verified"] > 0


def test_new_steps_are_verified_and_known_steps_reused(harness, tmp_path):
    """Adding a strategy adds steps to every family; only those steps are verified again."""
    from flows.pipeline import run_stage
    from flows.storage import read_table, write_shard

    params = load_params(profile="tiny")
    lake = tmp_path / "lake"
    for stage in ("generate", "transform"):
        run_stage(stage, params, lake, tmp_path / "reports")
    steps = read_table(lake, "steps").to_pylist()
    family = {p["program_id"]: p["family"] for p in read_table(lake, "programs").to_pylist()}
    new = [s for s in steps if s["strategy"] == "loop_split"]
    assert new
    for fam in sorted(set(family.values())):  # the lake as it was before loop_split existed
        write_shard(lake, "steps", fam, [s for s in steps if family[s["program_id"]] == fam and s not in new])
    before = run_stage("verify", params, lake, tmp_path / "reports")
    assert before["reused"] == 0 and before["verified"] == len(steps) - len(new)
    for fam in sorted(set(family.values())):
        write_shard(lake, "steps", fam, [s for s in steps if family[s["program_id"]] == fam])
    after = run_stage("verify", params, lake, tmp_path / "reports")
    assert after["verified"] == len(new) and after["reused"] == len(steps) - len(new)
    assert sorted(v["step_id"] for v in read_table(lake, "verifications").to_pylist()) == \
        sorted(s["step_id"] for s in steps)


def test_a_release_of_another_lake_neither_records_nor_tags_this_checkout(tiny_lake, tmp_path, monkeypatch):
    """`steptp release --version X --lake /elsewhere` used to commit dvc.lock and tag data-vX in the
    project's checkout, which describe its own lake/ only."""
    import shutil

    from typer.testing import CliRunner

    import flows.nightly
    from cli.main import app

    root, _ = tiny_lake
    lake = tmp_path / "lake"
    shutil.copytree(root / "lake", lake, ignore=shutil.ignore_patterns(".prefect-results"))
    shutil.copytree(root / "reports", tmp_path / "reports")
    touched = []
    for name in ("record_release", "commit_and_tag", "dvc_push"):
        monkeypatch.setattr(flows.nightly, name, lambda *a, _n=name, **k: touched.append(_n))
    result = CliRunner().invoke(app, ["release", "--version", "0.3.0", "--profile", "tiny", "--lake", str(lake),
                                      "--reports", str(tmp_path / "reports")])
    assert result.exit_code == 0, result.output
    assert (lake / "releases" / "v0.3.0" / "croissant.json").exists()
    assert "not recorded or tagged" in result.output and touched == []


def test_a_dead_worker_is_tried_again_and_never_replaces_a_verdict(harness, tmp_path, monkeypatch):
    """A step whose worker died is verified again by the next run (not replayed from a cache); a run
    whose rows could not be computed where the lake holds verdicts writes nothing."""
    import flows.verify as verify
    from flows.pipeline import run_stage
    from flows.storage import read_table

    params = load_params(profile="tiny")
    lake, reports = tmp_path / "lake", tmp_path / "reports"
    for stage in ("generate", "transform"):
        run_stage(stage, params, lake, reports)
    real = verify.verify_shard

    def dying(steps, signatures, params, pool=None, targets=None):  # the first row of each shard's worker dies
        rows = real(steps, signatures, params, pool, targets)
        return [{**r, "status": "crash", "error_message": "worker died (signal 9)"} if i == 0 else r
                for i, r in enumerate(rows)]

    monkeypatch.setattr(verify, "verify_shard", dying)
    first = run_stage("verify", params, lake, reports)
    crashed = sorted(v["step_id"] for v in read_table(lake, "verifications").to_pylist() if v["status"] == "crash")
    assert len(crashed) == first["shards"] > 0
    monkeypatch.setattr(verify, "verify_shard", real)
    second = run_stage("verify", params, lake, reports)
    assert second["verified"] == len(crashed) and second["reused"] == second["rows"] - len(crashed)
    held = read_table(lake, "verifications").to_pylist()
    assert all(v["status"] in verify.VERDICTS for v in held)
    shards = {p.name: p.read_bytes() for p in sorted((lake / "verifications").glob("*.parquet"))}

    calls = []

    def failing(steps, signatures, params, pool=None, targets=None):  # a broken harness, not the programs
        calls.append(len(steps))
        return [{**r, "status": "runtime_error", "error_message": "harness: no such tolerance"}
                for r in real(steps, signatures, params, pool, targets)]

    monkeypatch.setattr(verify, "verify_shard", failing)
    (lake / ".cache" / "verify").rename(tmp_path / "lost-cache")  # the rows must be computed again
    with pytest.raises(verify.UncomputedVerifications, match="runtime_error: harness: no such tolerance"):
        run_stage("verify", params, lake, reports)
    assert sum(calls) == first["rows"]  # computed, not replayed from the first run's tasks
    assert {p.name: p.read_bytes() for p in sorted((lake / "verifications").glob("*.parquet"))} == shards
    monkeypatch.setattr(verify, "verify_shard", real)  # the cause fixed: computed afresh, not replayed
    third = run_stage("verify", params, lake, reports)
    assert third["verified"] == third["rows"]
    assert {p.name: p.read_bytes() for p in sorted((lake / "verifications").glob("*.parquet"))} == shards


def test_a_second_machines_timings_are_released_beside_and_never_decide(tiny_lake, tmp_path):
    """A lake timed on two machines (the second one's rows made here from the first's, for half of
    the states, its effects reversed): `measured` holds one row per step and machine, each machine's
    effects from its own timings; `sft` and `preference` stay the deciding machine's; the card says
    which machine decided and how many rows each holds."""
    import shutil

    from flows.config import load_params
    from flows.release_configs import measured_inputs
    from flows.storage import read_table, write_shard

    root, _ = tiny_lake
    lake = tmp_path / "lake"
    shutil.copytree(root / "lake", lake)
    target = load_params(profile="tiny").verify["target"]
    timings = [r for r in read_table(lake, "timings").to_pylist() if r["target"] == target and r["status"] == "ok"]
    first = sorted({r["machine_id"] for r in timings})
    assert len(first) == 1
    states = sorted({r["state_id"] for r in timings})[::2]
    other = {**json.loads(timings[0]["machine"]), "id": "second-machine", "cpu_model": "Another CPU"}
    theirs = [{**r, "machine_id": "second-machine", "machine": json.dumps(other, sort_keys=True)}
              for r in timings if r["state_id"] in set(states)]
    write_shard(lake, "timings", "second-machine-all", theirs)
    flipped = {"faster": "slower", "slower": "faster"}
    effects = [e for e in read_table(lake, "effects").to_pylist() if e["target"] == target]
    theirs_effects = [{**e, "machine_id": "second-machine", "effect": flipped.get(e["effect"], e["effect"])}
                      for e in effects[::2]]
    write_shard(lake, "effects", "second-machine-all", theirs_effects)

    alone = measured_inputs(root / "lake", load_params(profile="tiny"))
    both = measured_inputs(lake, load_params(profile="tiny"))
    assert both.machine["id"] == first[0]                       # the machine that timed most states decides
    assert both.effects == alone.effects and both.sft == alone.sft and both.preference == alone.preference
    rows = both.rows("measured")
    assert len(rows) == len(alone.effects) + len(both.other_effects) and both.other_effects
    assert {r["machine_id"] for r in both.other_effects} == {"second-machine"}
    keys = [(r["step_id"], r["machine_id"]) for r in rows]
    assert len(keys) == len(set(keys))                           # one row per step and machine
    by_step = {r["step_id"]: r for r in alone.effects}
    for r in both.other_effects:                                  # each machine's own effects
        mine = by_step[r["step_id"]]
        assert r["effect"] == flipped.get(mine["effect"], mine["effect"]) or mine["machine_id"] is None
    from flows.measured import measured_section
    card = measured_section(both)
    assert "Several machines timed states of this release" in card
    assert f"`second-machine` (Another CPU): {len(both.other_effects)} rows, deciding 0" in card
    assert "Several machines" not in measured_section(alone)


def test_a_second_named_machine_times_the_same_lake_beside_the_first(tiny_lake, tmp_path, monkeypatch):
    """`STEPTP_MACHINE=worker-b steptp stage measure` on a lake the first machine timed: every state
    timed again under worker-b's own fingerprint, its shards beside the first machine's, its effects
    from its own timings; the release keeps both (the first decides: it timed as many states, and its
    id sorts first or it timed more)."""
    import shutil

    from flows.pipeline import run_stage
    from flows.release_configs import measured_inputs
    from flows.storage import read_table

    root, _ = tiny_lake
    lake = tmp_path / "lake"
    shutil.copytree(root / "lake", lake)
    before = {r["machine_id"] for r in read_table(lake, "timings").to_pylist()}
    monkeypatch.setenv("STEPTP_MACHINE", "worker-b")
    out = run_stage("measure", load_params(profile="tiny"), lake, tmp_path / "reports")
    timings = read_table(lake, "timings").to_pylist()
    machines = {r["machine_id"] for r in timings}
    assert len(before) == 1 and len(machines) == 2 and out["machine_id"] in machines - before
    named = [json.loads(r["machine"]) for r in timings if r["machine_id"] == out["machine_id"]]
    assert all(m["machine"] == "worker-b" for m in named) and out["states_reused"] == 0
    first, second = ({r["state_id"] for r in timings if r["machine_id"] == m and r["status"] == "ok"}
                     for m in (*before, out["machine_id"]))
    assert second >= first                                   # worker-b timed every state the first did
    effects = read_table(lake, "effects").to_pylist()
    assert {e["machine_id"] for e in effects} == machines
    m = measured_inputs(lake, load_params(profile="tiny"))
    assert {r["machine_id"] for r in m.other_effects} <= machines and m.other_effects
    assert len({(r["step_id"], r["machine_id"]) for r in m.rows("measured")}) == len(m.rows("measured"))
