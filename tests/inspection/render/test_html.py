"""The HTML report: self-contained, and rendered by headless Chromium (apt-get install chromium).

SMARTSTAGE_UPDATE_DOCS=1 also saves the screenshot of the DLRM-like report as docs/report.png.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import smartstage as ss
from smartstage.inspection.render.drawing import build_drawing
from smartstage.inspection.render.html import html_report
from tests.bounds import HANG_SECONDS
from tests.inspection.graphs import dlrm_example, tiny_graph

DOCS = Path(__file__).resolve().parents[3] / "docs"
CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed (apt-get install chromium)")
CHROMIUM_SECONDS = HANG_SECONDS


@pytest.fixture(scope="module")
def dlrm(tmp_path_factory):
    result = ss.optimize(dlrm_example(tmp_path_factory.mktemp("dlrm")), ss.enable_smart_stage())
    return result, result.diff()


@pytest.fixture(scope="module")
def dlrm_page(dlrm, tmp_path_factory):
    result, diff = dlrm
    path = tmp_path_factory.mktemp("html") / "report.html"
    path.write_text(html_report(diff, result, title="SmartStage report: DLRM-like example"), encoding="utf-8")
    return path


def chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp_path / "chromium-profile"
    command = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
               "--disable-background-networking", "--disable-component-update", "--disable-sync",
               "--hide-scrollbars", f"--user-data-dir={profile}", "--virtual-time-budget=5000", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=CHROMIUM_SECONDS, check=False)


def test_self_contained(dlrm):
    result, diff = dlrm
    page = html_report(diff, result)
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "") and "https://" not in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page), "no external script, style or image"
    assert page.count("<svg") == 1 and "<table id=\"ss-summary\">" in page and 'id="ss-search"' in page
    assert f"Moved to the prefetch side ({len(diff.moved_in('stage'))})" in page
    assert "preprocess/hash_C1" in page


def test_report_without_graphs_still_lists(tmp_path):
    """A diff read back from JSON has no graph: the page has the lists, and no drawing."""
    from smartstage.inspection.render.json_report import json_report, read_json_report

    diff = ss.optimize(tiny_graph(), ss.enable_smart_stage()).diff()
    page = html_report(read_json_report(json_report(diff)))
    assert "<svg" not in page and "Moved to the prefetch side (3)" in page


@needs_chromium
def test_rendered_in_headless_chromium(dlrm, dlrm_page, tmp_path):
    result, diff = dlrm
    # the stage folds into its dataset: the drawing has the step's new read of the iterator (hash_C1 runs in the map)
    done = chromium(tmp_path, "--dump-dom", dlrm_page.as_uri() + "#search=dataset_fold")
    assert done.returncode == 0, done.stderr[-2000:]
    dom = done.stdout
    body = re.search(r"<body([^>]*)>", dom).group(1)
    boxes = int(re.search(r'data-drawing-boxes="(\d+)"', body).group(1))
    width = int(re.search(r'data-drawing-width="(\d+)"', body).group(1))
    hits = int(re.search(r'data-search-hits="(\d+)"', body).group(1))
    assert boxes == len(build_drawing(diff).boxes) and width > 300, "the script ran and the SVG was laid out"
    assert hits >= 1, "the search lit a box of the drawing"
    assert re.search(r'<g class="box [^"]*\bhit\b', dom), "a lit box carries the 'hit' class"
    assert "matching entries" in dom
    assert f"Pinned on the main side ({len(diff.pinned_in('stage'))})" in dom and "reads variable" in dom
    hidden = len(re.findall(r"<li [^>]*hidden", dom))
    assert hidden > 100, "the search hides the entries that do not match"


@needs_chromium
def test_screenshot(dlrm_page, tmp_path):
    shot = tmp_path / "report.png"
    done = chromium(tmp_path, f"--screenshot={shot}", "--window-size=1400,1800", dlrm_page.as_uri())
    assert done.returncode == 0 and shot.exists(), done.stderr[-2000:]
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 20_000
    if os.environ.get("SMARTSTAGE_UPDATE_DOCS") == "1":
        DOCS.mkdir(exist_ok=True)
        (DOCS / "report.png").write_bytes(png)
