"""Sphinx configuration of onnxtrain's documentation.

Build with ``pip install -e ".[docs]"`` then
``python -m sphinx -W -b html docs docs/_build/html``.
"""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import onnxtrain  # noqa: E402

project = "onnxtrain"
author = "the onnxtrain developers"
copyright = "the onnxtrain developers, MIT license"
release = version = onnxtrain.__version__

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.mathjax",
    "numpydoc",
    "myst_parser",
    "sphinx_gallery.gen_gallery",
]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
root_doc = "index"
templates_path = ["_templates"]
exclude_patterns = ["_build", "generated/*.examples", "auto_examples/*.ipynb",
                    "auto_examples/*.py", "auto_examples/*.zip",
                    "auto_examples/*.md5", "auto_examples/*.json"]

autosummary_generate = True
autodoc_default_options = {"members": True, "inherited-members": False}
numpydoc_show_class_members = False
numpydoc_class_members_toctree = False
numpydoc_xref_param_type = False

myst_heading_anchors = 3
# pages link to the repository's files (tests, benchmarks, sources) by path
suppress_warnings = ["myst.xref_missing"]

html_theme = "pydata_sphinx_theme"
html_title = f"onnxtrain {release}"
html_theme_options = {
    "navbar_end": ["navbar-icon-links"],
    "show_toc_level": 2,
    "secondary_sidebar_items": ["page-toc"],
}
html_static_path = ["_static"]
html_css_files = ["custom.css"]


# --- examples gallery ----------------------------------------------------
# The examples write their pictures (PNG files) into the folder given as
# their first argument; docs/_gallery.py gives each a temporary folder and
# puts the pictures written there into its gallery page.
sys.path.insert(0, str(ROOT / "docs"))

sphinx_gallery_conf = {
    "examples_dirs": str(ROOT / "examples"),
    "gallery_dirs": "auto_examples",
    # run at build time: the quick CPU examples; the others (GPU, Dask) are
    # shown with their source only
    "filename_pattern": r"(diabetes_mlp|digits_classifier|seed_004_linear_regression)\.py$",
    "reset_argv": "_gallery.example_argv",
    "image_scrapers": ("_gallery.png_scraper",),
    "download_all_examples": False,
    "remove_config_comments": True,
    "within_subsection_order": "FileNameSortKey",
    "abort_on_example_error": True,
}


# --- docstrings ----------------------------------------------------------
def _skip_metadata_requests(app, what, name, obj, skip, options):
    """Leave out scikit-learn's generated ``set_*_request`` methods."""
    if name.startswith("set_") and name.endswith("_request"):
        return True
    return skip


def _literal_shape_names(app, what, name, obj, options, lines):
    """``of shape (n_features_in_,)``: names ending in ``_`` read as literals,
    not as reStructuredText link references."""
    def quote(match):
        inner = re.sub(r"(?<![`\w])(\w+_)(?![`\w])", r"``\1``", match.group(1))
        return f"of shape ({inner})"
    lines[:] = [re.sub(r"of shape \(([^)]*)\)", quote, line) for line in lines]


def setup(app):
    app.connect("autodoc-skip-member", _skip_metadata_requests)
    app.connect("autodoc-process-docstring", _literal_shape_names)
