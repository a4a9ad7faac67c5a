"""The example texts as a plain list (for property tests that mutate them)."""
import json
from pathlib import Path

EXAMPLE_TEXTS = [json.loads(line)["leir"] for line in
                 (Path(__file__).parent.parent / "data" / "programs.jsonl").read_text().splitlines() if line]
