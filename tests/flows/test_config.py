"""params.yaml: one value set in place (the nightly build writes the version it releases) keeps every
other byte of the file, comments and layout included."""
from __future__ import annotations

import pytest
import yaml

from flows.config import PARAMS, load_params, set_param


def test_set_param_changes_that_value_and_nothing_else(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text(PARAMS.read_text())
    set_param(path, ("release", "version"), "0.4.2")
    before, after = PARAMS.read_text().splitlines(), path.read_text().splitlines()
    changed = [(a, b) for a, b in zip(before, after, strict=True) if a != b]
    assert len(changed) == 1 and changed[0][1].startswith("  version: 0.4.2 ")  # the comment after it stays
    assert "#" in changed[0][1]
    assert load_params(path).release["version"] == "0.4.2"
    expected = yaml.safe_load(PARAMS.read_text())
    expected["release"]["version"] = "0.4.2"
    assert yaml.safe_load(path.read_text()) == expected


def test_set_param_quotes_what_yaml_would_read_otherwise(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text("a:\n  b: x   # note\n  c: [1, 2]\n")
    set_param(path, ("a", "b"), "yes")  # unquoted, YAML would read a boolean
    assert path.read_text() == "a:\n  b: 'yes'   # note\n  c: [1, 2]\n"
    assert yaml.safe_load(path.read_text())["a"]["b"] == "yes"


@pytest.mark.parametrize(("keys", "message"), [
    (("a", "missing"), r"no key a\.missing"),
    (("a", "c"), r"p\.yaml:3:6: a\.c is not a scalar"),
    (("a", "b", "d"), r"'d' is not inside a mapping"),
])
def test_set_param_says_what_is_wrong(tmp_path, keys, message):
    path = tmp_path / "p.yaml"
    path.write_text("a:\n  b: x\n  c: [1, 2]\n")
    with pytest.raises(ValueError, match=message):
        set_param(path, keys, "1")
    assert path.read_text() == "a:\n  b: x\n  c: [1, 2]\n"
