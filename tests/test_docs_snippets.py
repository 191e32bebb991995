"""Every ```python block of README.md and docs/*.md runs as written.

A block runs in a namespace holding what the page's earlier setup blocks
defined: a setup block is marked ``<!-- snippet-setup -->`` on the line
before it, and the blocks after it may use its names. A block that cannot
run here (a GPU, a long training, files the reader has) is marked
``<!-- skip-snippet: reason -->``; SKIPPED lists them, so that a new skip
is a decision the test sees. Blocks run in a temporary working directory.
"""
import pathlib
import re
import textwrap

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
BLOCK = re.compile(r"(?:<!--\s*(?P<mark>[^>]*?)\s*-->[ \t]*\n)?"
                   r"^(?P<indent>[ ]*)```python\n(?P<code>.*?)^(?P=indent)```",
                   re.DOTALL | re.MULTILINE)

# (page, first line of the block): blocks marked skip-snippet
SKIPPED = {
    ("docs/gpu.md", 'est = OrtGradientForwardBackwardOptimizer(onx, device="cuda")'),
    ("docs/pytorch.md", "# tokens int64 (N, T), mask float32 (N, T): your encoder's inputs"),
}


def snippets(page):
    """``(line, mark, code)`` of each python block of ``page``."""
    text = page.read_text(encoding="utf-8")
    for m in BLOCK.finditer(text):
        line = text.count("\n", 0, m.start("code")) + 1
        yield line, (m.group("mark") or ""), textwrap.dedent(m.group("code"))


def page_cases():
    for page in PAGES:
        blocks = list(snippets(page))
        if blocks:
            yield pytest.param(page, blocks, id=str(page.relative_to(ROOT)))


@pytest.mark.parametrize("page, blocks", page_cases())
def test_page_snippets_run(page, blocks, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = str(page.relative_to(ROOT))
    setup = {"__name__": "__snippet__"}
    for line, mark, code in blocks:
        if mark.startswith("skip-snippet"):
            assert (name, code.splitlines()[0]) in SKIPPED, (name, line)
            continue
        namespace = setup if mark == "snippet-setup" else dict(setup)
        try:
            exec(compile(code, f"{name}:{line}", "exec"), namespace)
        except Exception as exc:  # the page and line in the failure
            raise AssertionError(f"{name}, block at line {line}: {exc!r}") from exc


def test_skip_list_matches_the_marks():
    marked = {(str(page.relative_to(ROOT)), code.splitlines()[0])
              for page in PAGES for _, mark, code in snippets(page)
              if mark.startswith("skip-snippet")}
    assert marked == SKIPPED


def test_every_page_block_is_found():
    # a block the regex missed would silently never run
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        assert len(list(snippets(page))) == text.count("```python\n"), page
