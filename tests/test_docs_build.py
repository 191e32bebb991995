"""The documentation builds without a warning (``-W``), examples gallery
included; skipped where the ``docs`` extra is not installed."""
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("sphinx")
pytest.importorskip("numpydoc")
pytest.importorskip("sphinx_gallery")
pytest.importorskip("myst_parser")
pytest.importorskip("pydata_sphinx_theme")

DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def test_sphinx_builds_warning_free(tmp_path):
    out = tmp_path / "html"
    run = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html",
         "-d", str(tmp_path / "doctrees"), str(DOCS), str(out)],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    home = (out / "index.html").read_text(encoding="utf-8")
    assert "Estimators and conventions" in home            # the guide's toctree
    api = out / "generated" / "onnxtrain.OrtGradientForwardBackwardOptimizer.html"
    assert "learning_rate" in api.read_text(encoding="utf-8")   # numpydoc params
    gallery = (out / "auto_examples" / "diabetes_mlp.html").read_text(encoding="utf-8")
    assert "sphx_glr_diabetes_mlp_001.png" in gallery        # the example's plot
