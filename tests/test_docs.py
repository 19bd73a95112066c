"""The documentation as a product: the API reference builds, pages describe the product (no run logs),
the README stays a front page, every relative link resolves, and the plots render.

    README.md, docs/*.md     no clock times, commit hashes, "not re-run", first-person asides
    docs/perf/               dated run reports: free to say when and how they were measured
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOC_PAGES = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOC_PAGES]
QUICK_START = (
    'python3 -m pip install -e . && smartstage demo',
    'python3 -m pip install -e ".[test]" && python3 -m pytest -q',
)
# The API reference: the package's public names and the TF2 entry points (smartstage.compat is tf.compat.v1
# with DeepRec's names: docs/porting-deeprec.md lists them).
API_MODULES = ("smartstage", "smartstage.tf2")

# Run-log narrative: what a dated report under docs/perf/ may say and a product page may not.
NARRATIVE = re.compile(
    r"\b[0-9]{1,2}:[0-9]{2} UTC\b"
    r"|not re-run"
    r"|found and fixed"
    r"|the evening before"
    r"|\bthis session\b"
    r"|\bsessions? ago\b"
    r"|\bI (?:have|had|ran|found|measured|did|could|think|tried|saw)\b"
    r"|\bcommit [0-9a-f]{7,40}\b"
    r"|\bbefore this change\b"
    r"|\bmeasured here\b"
    r"|\bthe issue's reporter\b|\bthe reporter\b"
    r"|\bthe versions? read here\b"
    r"|\bon this (?:[0-9]+-core )?(?:host|machine)\b"
    r"|\bas before\b"
    r"|\bno longer\b"
    r"|\bthis (?:session|run|change|commit)\b"
    r"|\b(?:found|fixed) (?:and fixed|here)\b"
    r"|\bwe (?:found|measured|ran|saw|fixed)\b",
    re.IGNORECASE,
)
# A commit hash in prose: 7-40 hex digits with at least one digit and one letter, outside code.
HASH = re.compile(r"(?<![\w./#-])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w-])")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text without fenced code blocks and inline code spans (hex and times there are code, not history)."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_have_no_run_log_narrative(page: Path):
    text = prose(page.read_text())
    found = [m.group(0) for m in NARRATIVE.finditer(text)] + [m.group(0) for m in HASH.finditer(text)]
    assert not found, (f"{page.relative_to(ROOT)} narrates its development: {found[:10]}; say what is true of the "
                       "product, and put dated measurements in a report under docs/perf/")


PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.MULTILINE | re.DOTALL)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_python_examples_are_python(page: Path):
    for i, block in enumerate(PYTHON_BLOCK.findall(page.read_text())):
        compile(block, f"{page.relative_to(ROOT)}, python block {i + 1}", "exec")


def test_narrative_check_catches_what_it_should_and_ignores_code():
    assert NARRATIVE.search("a run at 01:31 UTC printed 1.12x")
    assert NARRATIVE.search("measured two sessions ago, not re-run")
    assert NARRATIVE.search("I have not found why")
    for phrase in ("a version the issue's reporter ran", "the versions read here call it", "on this host both cores",
                   "on this 2-core host", "the loop runs as before", "the shape no longer crosses",
                   "measured in this session", "a hang found and fixed"):
        assert NARRATIVE.search(phrase), phrase
    assert not NARRATIVE.search("the host's two cores run both sides; a session rewrites what it runs")
    assert HASH.search("the put before 32221d2 ran")
    assert not NARRATIVE.search(prose("```\nstep 12:00 UTC\n```"))
    assert not HASH.search(prose("`sha256:0a1b2c3d4e5f`, a fetch of `deadbeef12`"))
    assert not HASH.search("docs/perf/accelerator.md, 1,742 ops, DLRM-like, 2026-11-26")


def test_readme_is_a_front_page():
    text = README.read_text()
    words = len(re.findall(r"\S+", text))
    assert words <= 2000, f"README.md has {words} words; at most 2,000 (move detail to docs/)"
    for command in QUICK_START:
        assert command in text, f"README.md lost the quick-start command {command!r}"
    for section in ("## When it helps", "## Compatibility", "docs/troubleshooting.md", "docs/api.md"):
        assert section in text, f"README.md has no {section!r}"


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown page: lower case, punctuation dropped, spaces to hyphens."""
    slugs = set()
    for heading in re.findall(r"^#+ (.+)$", FENCE.sub("", page.read_text()), re.MULTILINE):
        slugs.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return slugs


@pytest.mark.parametrize("page", [*PAGES, *sorted((ROOT / "docs" / "perf").glob("*.md"))],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page: Path):
    missing = []
    for target in LINK.findall(prose(page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue
        path, _, anchor = target.partition("#")
        file = (page.parent / path) if path else page
        if not file.exists():
            missing.append(target)
        elif anchor and file.suffix == ".md" and anchor not in anchors(file):
            missing.append(target)
    assert not missing, f"{page.relative_to(ROOT)} links to files or headings that do not exist: {missing}"


def test_api_reference_builds(tmp_path: Path):
    pdoc = pytest.importorskip("pdoc", reason="pdoc is in the test and docs extras: pip install -e '.[test]'")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pdoc.pdoc(*API_MODULES, output_directory=tmp_path)
    problems = [f"{w.filename}:{w.lineno}: {w.message}" for w in caught if "pdoc" in Path(w.filename).parts]
    assert not problems, "pdoc could not document the API:\n" + "\n".join(problems)
    import smartstage
    import smartstage.tf2

    for module, names in (("smartstage", smartstage.__all__), ("smartstage/tf2", smartstage.tf2.__all__)):
        page = (tmp_path / f"{module}.html").read_text()
        # A name that is also a submodule's (smartstage.tf2.step.split) gets that module's page.
        undocumented = [name for name in names
                        if f'id="{name}"' not in page and not (tmp_path / module / f"{name}.html").exists()]
        assert not undocumented, f"{module}.html has no entry for {undocumented}"


def test_api_page_lists_every_public_name():
    import smartstage
    import smartstage.tf2

    text = (ROOT / "docs" / "api.md").read_text()
    missing = [name for name in smartstage.__all__ if f"`{name}`" not in text]
    missing += [f"tf2.{name}" for name in smartstage.tf2.__all__ if f"`tf2.{name}`" not in text]
    assert not missing, f"docs/api.md does not list {missing}"


def test_accelerator_plot_renders_from_a_small_result(tmp_path: Path):
    pytest.importorskip("matplotlib", reason="matplotlib is in the test and report extras")
    from benchmarks import plots

    def workload(model: str, device_ms: float, smart: float) -> dict:
        run = [{"steps_per_sec": smart}, {"steps_per_sec": smart * 1.1}, None]
        return {"workload": {"model": model, "device_ms": device_ms},
                "samples": {"no_stage [AUTOTUNE (defaults)]": [{"steps_per_sec": 40.0}] * 3,
                            "smart [AUTOTUNE (defaults)]": run,
                            "smart_lanes [AUTOTUNE (defaults)]": run},  # a configuration the plot does not know
                "bounds": [{"bare": 100.0, "cpu_bound": 150.0}] * 3}

    result = {"command": "python -m benchmarks.e2e --accelerator --publish", "machine": {"date": "2026-01-01"},
              "workloads": [workload(m, ms, s) for m in ("dlrm", "wide_deep") for ms, s in ((5.0, 60.0), (20.0, 95.0))]}
    fractions = plots.accelerator_fractions(result)
    assert [p[0] for p in fractions["dlrm"]["smart"]] == [5.0, 20.0]
    assert fractions["dlrm"]["smart"][0][1].median == pytest.approx(0.63)
    assert fractions["dlrm"]["cpu_bound"][0][1].median == pytest.approx(1.5)
    assert [p[0] for p in fractions["wide_deep"]["smart_lanes"]] == [5.0, 20.0]
    path = plots.plot_accelerator(result, tmp_path / "accelerator.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    tf2 = {"benchmark": "tf2", "command": "python -m benchmarks.tf2", "settings": [
        {"device_ms": d, "steps_per_second": {n: {"spread": {"median": 10.0, "low": 9.0, "high": 11.0}}
                                              for n, _ in plots.TF2_PROGRAMS}} for d in (0.0, 5.0)]}
    assert plots.plot_tf2(tf2, tmp_path / "tf2.png").stat().st_size > 0
    with pytest.raises(plots.PlotError):
        plots.plot_accelerator({"workloads": []}, tmp_path / "empty.png")


def test_anchors_are_githubs():
    slugs = anchors(ROOT / "README.md")
    assert {"when-it-helps-and-when-it-does-not", "three-ways-in", "quick-start"} <= slugs
    assert "my-checkpoint-restore-skips-or-repeats-records" in anchors(ROOT / "docs" / "troubleshooting.md")


def test_errors_page_lists_every_exception_type():
    """docs/errors.md has a row (raised when, fix) for every exception class smartstage/errors.py defines."""
    import inspect

    from smartstage import errors

    defined = [name for name, obj in vars(errors).items()
               if inspect.isclass(obj) and issubclass(obj, errors.SmartStageError) and obj is not errors.SmartStageError]
    rows = {m.group(1) for m in re.finditer(r"^\| `(\w+)` \|", (ROOT / "docs" / "errors.md").read_text(), re.MULTILINE)}
    missing = sorted(set(defined) - rows)
    assert defined and not missing, f"docs/errors.md has no row for {missing}: say when each is raised and the fix"


def test_troubleshooting_covers_the_first_errors():
    text = (ROOT / "docs" / "troubleshooting.md").read_text()
    for name in ("EagerModeError", "TargetError", "must be a tf.ConfigProto", "(errors.md)"):
        assert name in text, f"docs/troubleshooting.md does not cover {name!r}"


# A measured figure: a ratio (1.14x, 0.73-0.97x), a time per read (187 µs), a rate (340 steps/s), or a fraction of
# the bare step ("0.97-0.98 of the bare step"). Settings (a 5 ms device step, a 20% threshold, a split "kept from
# 1.05x") are not figures; write any other setting in a code span.
FIGURE = re.compile(r"(?<![\w.])(?<!from )\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)?(?:x\b| ?µs\b| steps/s\b)"
                    r"|\b0\.\d\d(?:-\d\.\d\d)? of (?:the|its) ")
PERF_LINK = re.compile(r"\]\((?:\.\./|docs/)?(perf/[^)#\s]+)")
ANY_CODE_SPAN = re.compile(r"`[^`]*`")  # a span may wrap a line: an example message is not a measurement


def sections(page: Path) -> list[str]:
    """The page's text outside code fences, cut at every heading."""
    return re.split(r"^(?=#{1,6} )", FENCE.sub("", page.read_text()), flags=re.MULTILINE)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_figure_cites_a_dated_report(page: Path):
    """A section that quotes a measured figure links the report under docs/perf/ it comes from."""
    unsourced = []
    for section in sections(page):
        figures = FIGURE.findall(ANY_CODE_SPAN.sub("", section))
        reports = PERF_LINK.findall(section)
        if figures and not reports:
            unsourced.append((section.split("\n", 1)[0][:60], figures[:4]))
        for report in reports:
            assert (ROOT / "docs" / report).exists(), f"{page.relative_to(ROOT)} cites a missing report {report}"
    assert not unsourced, (f"{page.relative_to(ROOT)} quotes figures without the report they come from (link one "
                           f"under docs/perf/ in the same section): {unsourced}")


def test_figure_pattern_finds_results_not_settings():
    found = lambda text: FIGURE.findall(ANY_CODE_SPAN.sub("", text))  # noqa: E731
    assert found("ran 1.03-1.49x the map") and found("187 µs a read") and found("0.97-0.98 of the bare step")
    assert found("at 340 steps/s") and found("ran 0.94x")
    assert not found("a 5 ms device step, 2 cores, batch 512, a 20% threshold, `0.84x the unsplit one`")
    assert not found("the split is kept from 1.05x")


def test_report_index_lists_every_report_with_its_date():
    """docs/perf/README.md links every report, and each row's date is one the report (or its json) states."""
    perf = ROOT / "docs" / "perf"
    index = (perf / "README.md").read_text()
    reports = sorted(p.name for p in perf.glob("*.md") if p.name != "README.md")
    unlisted = [name for name in reports if f"]({name})" not in index]
    assert not unlisted, f"docs/perf/README.md does not list {unlisted}"
    for row in (line for line in index.splitlines() if line.startswith("| [")):
        name = re.search(r"\]\(([^)]+\.md)\)", row).group(1)
        dates = re.findall(r"20\d\d-\d\d-\d\d", row.rsplit("|", 2)[-2])
        report = (perf / name).read_text()
        sibling = perf / name.replace(".md", ".json")
        stated = report + (sibling.read_text() if sibling.exists() else "")
        assert dates and dates[0] in stated, f"docs/perf/README.md dates {name} {dates[:1]}; the report says otherwise"
