"""Stable identifiers and seeded choices: sha256 of the item's identity, never hash() or set order."""
from __future__ import annotations

import hashlib
import json


def stable_id(*parts, length: int = 16) -> str:
    """Hex id of the parts (JSON-encoded with sorted keys, so dicts give the same id in any order)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def rank(seed: int, *parts) -> str:
    """A seeded sort key for deterministic sampling and shuffling."""
    return stable_id(seed, *parts, length=32)


def in_share(share: float, seed: int, *parts) -> bool:
    """A seeded choice of a `share` (0..1) of the items: True for the item whose identity is `parts`
    when its rank falls below that share of the rank space (uniform over items)."""
    return int(rank(seed, *parts), 16) < share * 16**32
