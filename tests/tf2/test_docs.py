"""docs/tf2.md runs as written: its python blocks are executed in order, in one namespace, in eager mode.

    ```python ... ```   executed          ```text ... ```   shown output, not executed
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.usefixtures("eager")

PAGE = Path(__file__).resolve().parents[2] / "docs" / "tf2.md"


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_page_has_before_and_after_code():
    blocks = python_blocks(PAGE.read_text())
    assert len(blocks) >= 6
    assert any("ss.tf2.split(" in b for b in blocks) and any("ss.tf2.fit(" in b for b in blocks)


def test_every_python_block_runs_in_order(tmp_path, monkeypatch, capsys):
    text = PAGE.read_text().replace("/tmp/", f"{tmp_path}/")
    namespace: dict = {"__name__": "docs_tf2"}
    for i, block in enumerate(python_blocks(text)):
        exec(compile(block, f"docs/tf2.md block {i}", "exec"), namespace)
    out = capsys.readouterr().out
    assert "moved to the prefetch side" in out and "captured state" in out
    assert "layer call(s) moved to the dataset" in out
    assert "identical: 10 step(s)" in out
    assert "moved to the prefetch side of stage" in out
    assert namespace["check"].identical
    assert (tmp_path / "ranker.keras").exists() and (tmp_path / "split.html").exists()
