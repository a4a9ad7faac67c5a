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
    def gpu_share(self) -> float:
        """The profile's share of original programs whose target is a GPU (`gpu_share`, 0 without it)."""
        share = float(self.profile.get("gpu_share") or 0.0)
        if not 0.0 <= share <= 1.0:
            raise ValueError(f"profile {self.profile_name!r}: gpu_share must lie in [0, 1], got {share}")
        return share

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


class ParamsError(ValueError):
    """params.yaml does not fit its schema (flows.params_schema); the message lists every problem."""


def load_params(path: Path = PARAMS, profile: str | None = None, overrides: dict | None = None) -> Params:
    """params.yaml (with `overrides` merged in) checked against its schema, with `profile` chosen."""
    from flows.params_schema import check_params

    text = Path(path).read_text()
    raw = yaml.safe_load(text)
    if overrides:
        raw, text = _merge(copy.deepcopy(raw), overrides), None
    name = profile or raw.get("profile", "default")
    if name not in raw.get("profiles", {}):
        raise ValueError(f"unknown profile {name!r}; params.yaml has {', '.join(raw.get('profiles', {}))}")
    problems = check_params(raw, path, text)
    if problems:
        raise ParamsError("\n".join(problems))
    return Params(raw, name)


def _merge(base: dict, extra: dict) -> dict:
    for k, v in extra.items():
        base[k] = _merge(base.get(k, {}), v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return base


def set_param(path: Path, keys: tuple[str, ...], value: str) -> None:
    """Set one scalar of a YAML file in place (e.g. `release.version` of params.yaml), keeping every
    other byte: comments, layout and the lead's profiles stay as written. The scalar is found by
    YAML's own parser (its position in the text), replaced, and the result is parsed again to check
    that exactly that value changed. Written atomically (temporary file + rename)."""
    path = Path(path)
    text = path.read_text()
    node = yaml.compose(text)
    for key in keys:
        if not isinstance(node, yaml.MappingNode):
            raise ValueError(f"{path}: {'.'.join(keys)}: {key!r} is not inside a mapping")
        found = [v for k, v in node.value if isinstance(k, yaml.ScalarNode) and k.value == key]
        if not found:
            raise ValueError(f"{path}: no key {'.'.join(keys)}")
        node = found[0]
    if not isinstance(node, yaml.ScalarNode):
        mark = node.start_mark
        raise ValueError(f"{path}:{mark.line + 1}:{mark.column + 1}: {'.'.join(keys)} is not a scalar")
    scalar = yaml.safe_dump(value, width=float("inf")).splitlines()[0]  # quoted where YAML needs it
    new = text[:node.start_mark.index] + scalar + text[node.end_mark.index:]
    expected, got = yaml.safe_load(text), yaml.safe_load(new)
    target = expected
    for key in keys[:-1]:
        target = target[key]
    target[keys[-1]] = value
    if got != expected:
        raise ValueError(f"{path}: setting {'.'.join(keys)} to {value!r} would change more than that value")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(new)
    tmp.replace(path)


def own_error_factor(params) -> float:
    """params.yaml `verify.pytorch_error_factor`: how many times PyTorch's own error in a program's dtype
    an original may have against the float64 reference (gpu_tasks.compare.raised_bounds)."""
    from gpu_tasks.verify import OWN_ERROR_FACTOR

    return float(params.verify.get("pytorch_error_factor", OWN_ERROR_FACTOR))
