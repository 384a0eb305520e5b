"""The wheel holds every package: a folder with an __init__.py that pyproject does not list
would be missing from a non-editable install."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_folder_is_listed_in_pyproject() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    found = {
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in (ROOT / "studio").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    resources = {
        ".".join(("studio", *p.relative_to(ROOT).parts))
        for p in (ROOT / "resources").rglob("*")
        if p.is_dir() and p.name != "__pycache__"
    }
    found |= resources  # data folders are packages too, or setuptools leaves them out
    assert found - listed == set(), "add these to [tool.setuptools] packages"
    assert config["package-dir"]["studio.resources"] == "resources"
    assert "studio.resources" in listed and (ROOT / "resources" / "__init__.py").is_file()


def test_license_file_and_spdx_expression() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert "Apache License" in (ROOT / "LICENSE").read_text()
