"""Every Python block of README.md and docs/*.md runs, or says that it is illustrative.

A reader pastes a page's blocks into one interpreter, top to bottom. So the runnable blocks of a page run in
that order as one script, in a fresh process, in an empty working directory. A block that is a fragment (it
names the reader's own `train_op`, a cluster, a GPU) is marked illustrative by the line

    <!-- illustrative -->

directly above its opening fence: GitHub does not render it, and this test then only compiles the block
(tests/test_docs.py). The marker is defined here, once (ILLUSTRATIVE); a page with no runnable block has
nothing to run and is listed as such, never skipped.

    README.md, docs/*.md     each runnable block runs, in page order, exit status 0
    docs/perf/               dated run reports: not run
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
ILLUSTRATIVE = "<!-- illustrative -->"
FENCE = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)
# Bounds only to catch a hang: far above what the slowest page takes on a loaded 2-core machine.
RUN_TIMEOUT_SECONDS = 1800

# What the reader is told happens, checked after a page's blocks ran (the names are the blocks' own).
CHECKS = {
    "README.md": """
# README example 1: an unstaged graph with auto_stage=True moves ops, and the result trains in a stock session
assert {"DecodeCSV", "StringToHashBucketFast"} <= result.moved(), result.summary()
moved_names = {n.name for n in after.graph_def.node}
assert not result.moved() & moved_names, "moved ops left in the graph"
assert "IteratorGetNext" not in moved_names and "train_op" in moved_names and "w" in moved_names
assert set(after.collection_def) >= {"train_op", "variables", "trainable_variables"}
assert result.fetch_map()["StringToHashBucketFast:0"].endswith("/IteratorGetNext:0"), result.fetch_map()
with tf.Graph().as_default() as graph:
    tf.compat.v1.train.import_meta_graph(after)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses = [sess.run(["Sum:0", "train_op"])[0] for _ in range(3)]
assert len(losses) == 3 and all(abs(x) < float("inf") for x in losses), losses
""",
}


@dataclass(frozen=True)
class Block:
    page: str
    line: int
    code: str
    illustrative: bool


def blocks_in(text: str, name: str) -> list[Block]:
    """The Python blocks of a page's text, each with whether the marker line stands directly above its fence."""
    found = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1].strip()
        found.append(Block(name, text[:match.start()].count("\n") + 1, match.group(1), before == ILLUSTRATIVE))
    return found


def blocks(page: Path) -> list[Block]:
    return blocks_in(page.read_text(), str(page.relative_to(ROOT)))


def script(page: Path) -> str:
    """The page's runnable blocks in page order, each under a comment naming its line, then the page's checks."""
    name = str(page.relative_to(ROOT))
    parts = [f"# {name}, line {b.line}\n{b.code}" for b in blocks(page) if not b.illustrative]
    return "\n".join(parts) + CHECKS.get(name, "")


RUNNABLE = [page for page in PAGES if any(not b.illustrative for b in blocks(page))]


def test_every_page_is_either_run_or_wholly_illustrative():
    """The pages the run test below covers, and the ones it does not (every block marked): none is skipped."""
    ids = lambda pages: sorted(str(p.relative_to(ROOT)) for p in pages)  # noqa: E731
    with_blocks = [p for p in PAGES if blocks(p)]
    assert set(RUNNABLE) <= set(with_blocks)
    assert "README.md" in ids(RUNNABLE), "README example 1 must run"
    for page in set(with_blocks) - set(RUNNABLE):
        assert all(b.illustrative for b in blocks(page)), page
    assert set(CHECKS) <= set(ids(RUNNABLE)), "a page with checks has no runnable block"


def test_the_marker_stands_only_above_python_blocks():
    for page in PAGES:
        lines = page.read_text().splitlines()
        for i, line in enumerate(lines):
            if line.strip() == ILLUSTRATIVE:
                following = next((x for x in lines[i + 1:] if x.strip()), "")
                assert following.startswith("```python"), (
                    f"{page.relative_to(ROOT)}:{i + 1}: {ILLUSTRATIVE} must stand directly above a ```python block")


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: str(p.relative_to(ROOT)))
def test_runnable_blocks_run(page: Path, tmp_path: Path):
    path = tmp_path / "page.py"
    path.write_text(script(page))
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(ROOT)}
    # A FutureWarning raised at a line of the page (a deprecated spelling in the docs) fails the run.
    done = subprocess.run([sys.executable, "-W", "error::FutureWarning:__main__", str(path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=RUN_TIMEOUT_SECONDS)
    assert done.returncode == 0, (f"{page.relative_to(ROOT)}: its runnable blocks failed (mark a fragment "
                                  f"{ILLUSTRATIVE} or fix it):\n{done.stderr[-4000:]}")


def test_blocks_and_the_marker_are_found():
    # A marked fragment, then a runnable block, then a bash block (not Python: not collected).
    text = f"x\n\n{ILLUSTRATIVE}\n```python\nsess.run(train_op)\n```\n\n```python\nx = 1\n```\n```bash\nls\n```\n"
    found = blocks_in(text, "probe.md")
    assert [(b.line, b.illustrative, b.code) for b in found] == [(4, True, "sess.run(train_op)\n"),
                                                                  (8, False, "x = 1\n")]
