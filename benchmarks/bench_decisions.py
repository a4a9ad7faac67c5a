"""Whether the measurements decide what a release teaches, read off it as a researcher would, with
DuckDB and Hugging Face `datasets`:

    python benchmarks/bench_decisions.py RELEASE_DIR [--lake LAKE]

Prints: the rounds of every timed state (from the lake's `timings`, when `--lake` is given), the
effect classes of the timed steps, the share of `enabling` steps with a `chain_speedup` (goal 90%),
`slower` and dead-end steps in `sft` (goal: none), the claim/effect contradictions among resolved
timed steps (goal at most 3%) and the strategies that have them, the preference pairs and prompts
(release goal: 1,000 pairs from 200 prompts) with the share whose chosen step is faster than the
unmodified program, the trajectories (every state verified and timed, none in the fast_exp config's
format outside it), and whether every config loads with `datasets`. Each goal is printed with the
ratio of the figure to it.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import duckdb


def q(con, sql: str):
    return con.execute(sql).fetchall()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("release", nargs="?", default="lake/releases/v0.1.0",
                        help="a release directory (default: the one make run writes)")
    parser.add_argument("--lake", default=None, help="the lake the release was built from (for the rounds)")
    args = parser.parse_args()
    rel = Path(args.release)
    if not (rel / "measured").exists():
        print(f"bench_decisions: {rel} has no measured config; run `make run` first (or pass a release folder)")
        return
    con = duckdb.connect()
    for c in ("measured", "gpu_steps", "sft", "preference", "trajectories"):
        files = sorted((rel / c).glob("*.parquet"))
        con.execute(f"CREATE VIEW {c} AS SELECT * FROM read_parquet({[str(f) for f in files]})" if files else
                    f"CREATE VIEW {c} AS SELECT NULL AS x WHERE false")
    if args.lake:
        [(lo, med, hi, n)] = q(con, f"SELECT min(rounds), median(rounds), max(rounds), count(*) FROM "
                                    f"read_parquet('{args.lake}/timings/*.parquet') WHERE status = 'ok'")
        print(f"timed states: {n} rows, rounds {lo}-{hi} (median {med:g}); goal at least 5: ratio {lo / 5:.2f}")
    rows = q(con, "SELECT effect, count(*) FROM measured WHERE effect IS NOT NULL GROUP BY 1 ORDER BY 1")
    print("timed steps: " + ", ".join(f"{e} {n}" for e, n in rows))
    [(units,)] = q(con, "SELECT string_agg(timing_unit || ' ' || n, ', ') FROM (SELECT timing_unit, count(*) n "
                        "FROM measured WHERE effect IS NOT NULL GROUP BY 1 ORDER BY 1)")
    print(f"compared on: {units}")
    [(en, chained)] = q(con, "SELECT count(*), count(chain_speedup) FROM measured WHERE claim = 'enabling' "
                             "AND effect IS NOT NULL")
    print(f"enabling timed steps with a chain_speedup: {chained} of {en} ({100 * chained / max(en, 1):.1f}%; goal "
          f"90%, ratio {chained / max(en, 1) / 0.9:.2f})")
    [(pays, dead)] = q(con, "SELECT count(*) FILTER (WHERE chain_effect = 'faster'), count(*) FILTER (WHERE dead_end) "
                            "FROM measured WHERE claim = 'enabling' AND effect IS NOT NULL")
    print(f"  chains that pay {pays}, dead ends {dead}")
    [(all_en, all_chained)] = q(con, "SELECT count(*), count(chain_speedup) FROM measured WHERE claim = 'enabling'")
    print(f"  every enabling step of measured, untimed ones included: {all_chained} of {all_en} "
          f"({100 * all_chained / max(all_en, 1):.1f}%; goal 90%, ratio {all_chained / max(all_en, 1) / 0.9:.2f})")
    [(gpu,)] = q(con, "SELECT count(*) FROM gpu_steps")
    print(f"  gpu_steps (steps of GPU programs, never timed, not in measured): {gpu}")
    [(n_sft, slower, kinds)] = q(con, "SELECT count(*), count(*) FILTER (WHERE effect = 'slower' OR step_effect = "
                                      "'slower'), string_agg(DISTINCT kind, ',') FROM sft")
    [(dead_sft,)] = q(con, "SELECT count(*) FROM sft s JOIN measured m ON m.step_id = json_extract_string(s.step_ids, "
                           "'$[0]') WHERE m.dead_end")
    print(f"sft: {n_sft} rows ({kinds}); slower {slower}, dead ends {dead_sft} (goal: none)")
    [(resolved, bad)] = q(con, """SELECT count(*), count(*) FILTER (WHERE (claim = 'benefit' AND effect = 'slower')
                                  OR (claim = 'none' AND effect = 'faster' AND speedup >= 1.2))
                                  FROM measured WHERE effect IN ('faster', 'neutral', 'slower')""")
    share = bad / max(resolved, 1)
    print(f"claim/effect contradictions: {bad} of {resolved} resolved timed steps ({100 * share:.1f}%; goal at most "
          f"3%, ratio {share / 0.03:.2f})")
    worst = q(con, """SELECT strategy, count(*) FILTER (WHERE (claim = 'benefit' AND effect = 'slower')
                      OR (claim = 'none' AND effect = 'faster' AND speedup >= 1.2)) AS bad, count(*)
                      FROM measured WHERE effect IN ('faster', 'neutral', 'slower') GROUP BY 1 HAVING bad > 0
                      ORDER BY bad DESC, 1 LIMIT 10""")
    print("  by strategy: " + ", ".join(f"{k} {b}/{n}" for k, b, n in worst))
    [(pairs, prompts, faster)] = q(con, "SELECT count(*), count(DISTINCT prompt), count(*) FILTER (WHERE "
                                        "chosen_speedup_low > 1.05) FROM preference")
    print(f"preference: {pairs} pairs from {prompts} prompts (release goals 1,000 and 200: ratios "
          f"{pairs / 1000:.2f}, {prompts / 200:.2f}); chosen faster than the program beyond its interval: {faster}")
    traj = q(con, "SELECT count(*), sum(steps), sum(len(states)), count(*) FILTER (WHERE list_filter(verification, "
                  "lambda v: v NOT IN ('exact', 'close')) <> []), count(*) FILTER (WHERE list_filter(times_us, "
                  "lambda t: t IS NULL) <> []), count(*) FILTER (WHERE list_filter(params, lambda x: x LIKE "
                  "'%\"exp\"%') <> [] OR format <> 'published') FROM trajectories")
    if traj and traj[0][0]:
        n, steps, states, unverified, untimed, extension = traj[0]
        print(f"trajectories: {n} ({steps} steps, {states} states); with a state not verified exact or close: "
              f"{unverified}, with an untimed state: {untimed}, using fast_exp: {extension} (goal: none of each)")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets
    import yaml

    datasets.disable_progress_bars()
    header = yaml.safe_load((rel / "README.md").read_text().split("---")[1])
    loaded = []
    for c in header["configs"]:
        ds = datasets.load_dataset(str(rel), c["config_name"], cache_dir=str(rel.parent / ".hf-cache"))
        loaded.append(f"{c['config_name']} " + "/".join(str(ds[s].num_rows) for s in ds))
    print("datasets loads: " + ", ".join(loaded))


if __name__ == "__main__":
    sys.exit(main())
