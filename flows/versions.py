"""Release versions: semantic versions of published releases, development versions of data that
changed after one, the version of the next automatic release, and the release's own date."""
from __future__ import annotations

import re
from pathlib import Path

from flows.lake_guard import SEMVER


class ReleaseError(Exception):
    pass


# A development release (semantic versioning's pre-release `dev` with the content hash as build
# metadata): what the default build writes when the data changed and release.version did not.
DEV_VERSION = re.compile(r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)-dev\+([0-9a-f]{12})$")


SEMVER_RULES = """\
- **MAJOR** (X): the record format changes (columns, answer format, LEIR conventions) or strategies
  are renamed or removed; consumers must adapt.
- **MINOR** (Y): more data in the same format: new workloads, strategies, dtypes or shapes.
- **PATCH** (Z): corrections of existing records with the same selection (verification fixes,
  filter fixes, CoT wording)."""


def parse_version(version: str, development: bool = False) -> tuple[int, int, int]:
    """(major, minor, patch) of a published version; with `development`, also of a development one
    (`0.1.1-dev+<hash>`)."""
    m = SEMVER.match(version) or (DEV_VERSION.match(version) if development else None)
    if not m:
        raise ReleaseError(f"version must be MAJOR.MINOR.PATCH (semantic versioning), got {version!r}")
    return tuple(int(x) for x in m.groups()[:3])  # type: ignore[return-value]


def development_version(published: str, earlier: list[str], digest: str) -> str:
    """The development release of data that changed after `published`: the next patch above it and
    every release made, as a pre-release `dev` with the first 12 hex digits of the content hash as
    build metadata (`0.1.1-dev+3f2a...`). It sorts below the release it leads to and never takes a
    published version's place."""
    top = max([parse_version(published), *(parse_version(v) for v in earlier)])
    return f"{top[0]}.{top[1]}.{top[2] + 1}-dev+{digest[:12]}"


def previous_versions(releases: Path) -> list[str]:
    found = [p.name[1:] for p in releases.glob("v*") if SEMVER.match(p.name[1:])]
    return sorted(found, key=parse_version)


VERSION_POLICIES = ("patch", "minor", "major")


def next_version(released: list[str], configured: str, policy: str = "patch") -> str:
    """The version of the next automatic (nightly) release: `configured` (params.yaml's
    `release.version`) while it is above every release made, otherwise the last release bumped by
    `policy` (`release.version_policy`: patch, minor or major)."""
    if policy not in VERSION_POLICIES:
        raise ReleaseError(f"release.version_policy must be one of {', '.join(VERSION_POLICIES)}, got {policy!r}")
    wanted = parse_version(configured)
    made = sorted((parse_version(v) for v in released), reverse=True)
    if not made or wanted > made[0]:
        return configured
    major, minor, patch = made[0]
    bumped = {"patch": (major, minor, patch + 1), "minor": (major, minor + 1, 0), "major": (major + 1, 0, 0)}[policy]
    return "{}.{}.{}".format(*bumped)


def release_date(params) -> str:
    """The release's own date, `release.date` of params.yaml (YYYY-MM-DD): what Croissant's
    `datePublished` and the card say. Never the build's clock: `dvc repro` rebuilds a release bit for bit."""
    import datetime

    value = params.release.get("date")
    if isinstance(value, datetime.date):  # YAML reads an unquoted 2026-12-01 as a date
        return value.isoformat()
    try:
        return datetime.date.fromisoformat(str(value)).isoformat()
    except ValueError:
        raise ReleaseError(f"release.date in params.yaml must be the release's date, YYYY-MM-DD "
                           f"(got {value!r})") from None
