"""The package's metadata builds without warnings."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path


def test_pyproject_licence_is_an_spdx_string(tmp_path):
    root = Path(__file__).resolve().parents[1]
    shutil.copy(root / "pyproject.toml", tmp_path)
    shutil.copy(root / "README.md", tmp_path)
    (tmp_path / "src" / "bertforge").mkdir(parents=True)
    (tmp_path / "src" / "bertforge" / "__init__.py").write_text("")
    code = (
        "import tempfile; from setuptools import build_meta; "
        "build_meta.prepare_metadata_for_build_wheel(tempfile.mkdtemp())"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert "Deprecat" not in run.stderr and "License" not in run.stderr, run.stderr
