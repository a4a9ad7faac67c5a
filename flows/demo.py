"""The main job until the pipeline exists: parse, print, validate and hash the bundled examples."""
from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

EXAMPLES = Path(__file__).resolve().parent.parent / "tests" / "data" / "programs.jsonl"


def run_examples(path: Path = EXAMPLES) -> int:
    """Round-trip, validate and hash every example; returns the process exit status."""
    from leir.canon import alpha_hash
    from leir.parse import parse_program
    from leir.printer import format_program
    from leir.signature import Signature
    from leir.validate import validate

    console = Console(stderr=True)
    table = Table(title=f"LEIR examples ({path.name})")
    for col in ("program", "chars", "nests", "round-trip", "valid", "alpha hash"):
        table.add_column(col)
    failures = 0
    for line in path.read_text().splitlines():
        ex = json.loads(line)
        program = parse_program(ex["leir"])
        sig = Signature.from_json(ex["signature"])
        same = format_program(program) == ex["leir"]
        problems = validate(program, sig)
        failures += (not same) + bool(problems)
        table.add_row(ex["name"], str(len(ex["leir"])), str(len(program.nests)), "yes" if same else "NO",
                      "yes" if not problems else "; ".join(map(str, problems)), alpha_hash(program, sig)[:16])
    console.print(table)
    return 1 if failures else 0
