"""Pipeline parameters: `params.yaml` with the chosen profile resolved into one flat view."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
PARAMS = ROOT / "params.yaml"


@dataclass(frozen=True)
class Params:
    raw: dict
    profile_name: str

    @property
    def seed(self) -> int:
        return int(self.raw["seed"])

    @property
    def profile(self) -> dict:
        return self.raw["profiles"][self.profile_name]

    @property
    def verify(self) -> dict:
        return self.raw["verify"]

    @property
    def filter(self) -> dict:
        """params.yaml's `filter` section with the profile's own `filter` entries on top (a release-scale
        profile raises the caps)."""
        return _merge(copy.deepcopy(self.raw["filter"]), copy.deepcopy(self.profile.get("filter") or {}))

    @property
    def release(self) -> dict:
        return self.raw["release"]


def load_params(path: Path = PARAMS, profile: str | None = None, overrides: dict | None = None) -> Params:
    raw = yaml.safe_load(Path(path).read_text())
    if overrides:
        raw = _merge(copy.deepcopy(raw), overrides)
    name = profile or raw.get("profile", "default")
    if name not in raw.get("profiles", {}):
        raise ValueError(f"unknown profile {name!r}; params.yaml has {', '.join(raw.get('profiles', {}))}")
    return Params(raw, name)


def _merge(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base
