"""The targets page the benchmarks cite (docs/targets.md) is in the repository and agrees with the code: its
results schema is engine.SCHEMA's prefix, and no file points at a copy outside the repository."""

import pathlib
import re
import subprocess

import pytest

from flashc.testing.engine import SCHEMA

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_results_schema_matches_the_page():
    text = (ROOT / "docs" / "targets.md").read_text()
    m = re.search(r"with these columns \(more may\s+follow\): `([^`]*)`", text)
    assert m, "docs/targets.md has no results schema line"
    columns = [c for c in re.sub(r"\s+", "", m.group(1)).split(",") if c]
    assert list(SCHEMA[: len(columns)]) == columns


def test_no_reference_to_a_targets_file_outside_the_repository():
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    paths = ["README.md", "python", "bench", "docs"]
    found = subprocess.run(
        ["git", "grep", "-n", "-E", r"TARGETS\.md|/work/shared", "--", *paths], cwd=ROOT, capture_output=True, text=True
    )
    assert found.stdout == "", "references to a targets file outside the repository:\n" + found.stdout
