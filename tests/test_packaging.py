"""The pyproject package list matches the folders on disk (a missing subpackage would be left out
of the wheel silently; docs/design.md §1)."""

from __future__ import annotations

import pathlib
import tomllib

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_every_subpackage_is_listed_in_pyproject() -> None:
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(cfg["packages"])
    on_disk = {
        ".".join([ns, *init.parent.relative_to(ROOT / folder).parts])
        for ns, folder in cfg["package-dir"].items()
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert on_disk - listed == set(), (
        f"add to [tool.setuptools].packages: {sorted(on_disk - listed)}"
    )
    assert listed - on_disk == set(), f"listed but missing on disk: {sorted(listed - on_disk)}"
