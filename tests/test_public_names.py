"""Every public name onnxtrain exported before the redesign of issue 33
(tests/public_names.txt) still imports from the module it came from, and
each module's ``__all__`` names objects that exist."""
import importlib
import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _listed():
    with open(os.path.join(HERE, "public_names.txt"), encoding="utf-8") as f:
        rows = [line.split() for line in f if line.strip() and not line.startswith("#")]
    return {row[0]: row[1:] for row in rows}


LISTED = _listed()


def test_the_list_is_not_empty():
    assert len(LISTED) >= 69 and sum(map(len, LISTED.values())) >= 351


@pytest.mark.parametrize("module", sorted(LISTED))
def test_public_names_still_import(module):
    mod = importlib.import_module(module)
    missing = [name for name in LISTED[module] if not hasattr(mod, name)]
    assert missing == []


@pytest.mark.parametrize("module", sorted(LISTED))
def test_all_names_exist(module):
    mod = importlib.import_module(module)
    assert [n for n in getattr(mod, "__all__", ()) if not hasattr(mod, n)] == []
