"""The golden example programs as plain lists (importable by name from tests in this folder)."""
import json
from pathlib import Path

EXAMPLES = [json.loads(line) for line in
            (Path(__file__).parent.parent / "data" / "programs.jsonl").read_text().splitlines() if line]
EXAMPLE_TEXTS = [e["leir"] for e in EXAMPLES]
