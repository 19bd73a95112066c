"""docs/api.md is what `python -m tools.apidoc` gives for the code, and everything a user handles is reachable
from `smartstage` or `smartstage.tf2`: every error type, the fit results, the names the docs point to.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import subprocess
import sys

import pytest

import smartstage
import smartstage.tf2
from tests.bounds import JOB_HANG_SECONDS
from tools import apidoc


def test_the_api_page_is_what_the_code_gives():
    # The command a developer runs, in a fresh interpreter: what earlier tests imported or evaluated in this
    # process (an annotation resolved to its object reads with its module path) is not what the page holds.
    done = subprocess.run([sys.executable, "-m", "tools.apidoc", "--check"], cwd=apidoc.REPO_ROOT,
                          capture_output=True, text=True, timeout=JOB_HANG_SECONDS)
    assert done.returncode == 0, f"docs/api.md is out of date: run `{apidoc.COMMAND}`\n{done.stdout[-2000:]}"


def test_the_page_has_every_public_name_with_its_signature():
    text = apidoc.render()
    for name in smartstage.__all__:
        assert f"### `{name}`\n\n```\n" in text, name
    for name in smartstage.tf2.__all__:
        assert f"### `tf2.{name}`\n\n```\ntf2.{name}" in text, name
    assert "verify_rewrite(\n    graph,\n    steps: int = 20,\n" in text
    assert "class InputTaskError(StageRuntimeError)" in text


@pytest.mark.parametrize("value, shown", [
    ((ValueError,), "(ValueError,)"),
    (os.path.join, "join"),
    (object(), "<object object>"),  # no address: the page is the same on every run
])
def test_signature_values_read_the_same_on_every_run(value, shown):
    assert apidoc.value_text(value) == shown


def test_a_name_without_a_section_is_refused():
    def orphan():
        """Defined here, in no section's module."""

    with pytest.raises(LookupError, match=r"no section for 'orphan' \(defined in tests.test_api_doc\)"):
        apidoc.section_of("orphan", orphan)


def _package_modules():
    for info in pkgutil.walk_packages(smartstage.__path__, "smartstage."):
        if not info.name.endswith("__main__"):
            yield info.name


def test_every_error_type_is_reachable_from_smartstage():
    errors = set()
    for name in _package_modules():
        module = importlib.import_module(name)
        errors |= {value for value in vars(module).values() if isinstance(value, type)
                   and issubclass(value, smartstage.SmartStageError) and value.__module__ == name
                   and not value.__name__.startswith("_")}
    assert len(errors) > 10
    unreachable = sorted(e.__name__ for e in errors if getattr(smartstage, e.__name__, None) is not e)
    assert not unreachable, f"error types not exported from smartstage: {unreachable}"


def test_what_the_docs_point_to_is_reachable_after_import_smartstage():
    # a fresh process: `import smartstage as ss`, then attributes only, as a user's script does
    script = """
import sys
import smartstage as ss
assert "tensorflow" not in sys.modules, "import smartstage imported TensorFlow"
reached = [ss.runtime.run_initializer, ss.run_initializer, ss.GraphView, ss.LoopbackCluster,
           ss.tf2.NotSplit, ss.tf2.StepFit, ss.tf2.KerasSplit, ss.tf2.same_batches, ss.inspection.loopback,
           ss.graph.view.GraphView, ss.InputTaskError, ss.text_report]
assert ss.run_initializer is ss.runtime.run_initializer and ss.GraphView is ss.graph.view.GraphView
assert ss.tf2.same_batches is ss.tf2.step.compare.same_batches
print("ok")
"""
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=JOB_HANG_SECONDS, cwd=apidoc.REPO_ROOT)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-3000:]

