"""docs/api.md from the code: every public name of `smartstage` and `smartstage.tf2`, with its signature and
the first paragraph of its docstring, grouped by what it is for.

    python -m tools.apidoc > docs/api.md     # write the page
    python -m tools.apidoc --check           # exit 1 when docs/api.md differs from what the code gives

tests/test_api_doc.py runs the check. pdoc (`pdoc smartstage smartstage.tf2`) stays the full reference with
every docstring and the source; this page is the one that reads on GitHub without building anything.
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PAGE = REPO_ROOT / "docs" / "api.md"
COMMAND = "python -m tools.apidoc > docs/api.md"
WIDTH = 110  # a longer signature gets one parameter a line


@dataclass(frozen=True)
class Section:
    title: str
    guides: str            # where the guide pages are, as Markdown links relative to docs/
    modules: tuple = ()    # a name defined in one of these modules (or below) belongs here


SECTIONS = (
    Section("Optimizing a graph", "[the README](../README.md), [auto-stage](auto_stage.md), [GPU](gpu.md), "
            "[scale-out](scale-out.md)",
            ("smartstage.optimizer", "smartstage.result", "smartstage.config", "smartstage.graph")),
    Section("The staging runtime", "[the staging runtime](runtime.md)", ("smartstage.runtime", "smartstage.protos")),
    Section("Sessions: the flag in a training loop", "[session integration](session.md)", ("smartstage.session",)),
    Section("Inspecting a rewrite", "[inspecting a rewrite](inspect.md), [troubleshooting](troubleshooting.md)",
            ("smartstage.inspection",)),
    Section("TensorFlow 2 (`smartstage.tf2`)", "[TensorFlow 2](tf2.md)", ("smartstage.tf2",)),
    Section("Errors", "[errors](errors.md): every message names the node, field or file and the fix"),
)
ERRORS = SECTIONS[-1]
# Names whose object carries no module of its own (values; ss.ConfigProto, a message class built at run time):
# where each one belongs.
NAMED_SECTIONS = {"AUTOTUNE": "The staging runtime", "STAGES_COLLECTION": "The staging runtime",
                  "TARGETS_COLLECTION": "The staging runtime", "ConfigProto": "Optimizing a graph"}

# What a value is (a value has no docstring of its own).
VALUE_NOTES = {"AUTOTUNE": "The setting (capacity, num_threads, the pool) the runtime measures and chooses while "
                           "training.",
               "STAGES_COLLECTION": "The MetaGraphDef collection that holds the StageDefs.",
               "TARGETS_COLLECTION": "The collection that holds the names of the nodes marked as targets."}

HEADER = f"""# API reference

Every public name of `smartstage` (`import smartstage as ss`) and of `smartstage.tf2` (`ss.tf2.fit`), with its
signature and the first paragraph of its docstring. `import smartstage` does not import TensorFlow; each name
is imported on first use, and so are the subpackages (`ss.runtime`, `ss.inspection`, ...).

This page is generated from the code (`{COMMAND}`; `tests/test_api_doc.py` fails when it is out of date).
The full reference, every docstring and the source, is pdoc's: `python3 -m pip install -e ".[docs]"`, then
`pdoc smartstage smartstage.tf2` (a local server) or `pdoc -o <folder> smartstage smartstage.tf2` (HTML files).
"""

FOOTER = """## DeepRec names (`smartstage.compat`)

`from smartstage.compat import tf` gives `tf.compat.v1` with DeepRec's names (`tf.staged`,
`tf.make_prefetch_hook`, `tf.train.mark_target_node`, `tf.ConfigProto`, `tf.SmartStageOptions`, ...); DeepRec's
option names (`do_smart_stage`, `do_smart_stage_gpu`, `stage_multi_stream`) are the options' own names. See
[porting-deeprec.md](porting-deeprec.md).

## The command line

`smartstage --help` lists the commands (`optimize`, `diff`, `explain`, `verify`, `demo`); each has its own
`--help`. See [inspect.md](inspect.md).
"""


def _name_of(value) -> str:
    return getattr(value, "__qualname__", None) or getattr(value, "__name__", None) or repr(value)


# Reprs that hold a memory address or a module path: what the reader needs is the name.
_CLASS = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_FUNCTION = re.compile(r"<(?:function|built-in function|bound method) ([\w.<>]+)(?: of [^>]*)? at 0x[0-9a-f]+>")
_ADDRESS = re.compile(r" at 0x[0-9a-f]+")


def value_text(value) -> str:
    text = _CLASS.sub(r"\1", repr(value))
    text = _FUNCTION.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return _ADDRESS.sub("", text)


def _annotation(annotation) -> str:
    if isinstance(annotation, str):  # `from __future__ import annotations`: as written
        return annotation
    if isinstance(annotation, type):
        return annotation.__qualname__
    return value_text(annotation).replace("typing.", "")


def _parameter(parameter: inspect.Parameter) -> str:
    prefix = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}.get(parameter.kind, "")
    text = prefix + parameter.name
    annotated = parameter.annotation is not inspect.Parameter.empty
    if annotated:
        text += ": " + _annotation(parameter.annotation)
    if parameter.default is not inspect.Parameter.empty:
        text += (" = " if annotated else "=") + value_text(parameter.default)
    return text


def _parameters(signature: inspect.Signature) -> list[str]:
    """The parameters as Python writes them, with the `/` and `*` markers."""
    kinds = inspect.Parameter
    rendered, positional_only, star = [], False, True
    for parameter in signature.parameters.values():
        if parameter.kind == kinds.POSITIONAL_ONLY:
            positional_only = True
        elif positional_only:
            rendered.append("/")
            positional_only = False
        if parameter.kind == kinds.VAR_POSITIONAL:
            star = False
        elif parameter.kind == kinds.KEYWORD_ONLY and star:
            rendered.append("*")
            star = False
        rendered.append(_parameter(parameter))
    if positional_only:
        rendered.append("/")
    return rendered


def signature_line(name: str, value) -> str:
    """How `name` is called (a function or class), or what it is (an exception class, a value)."""
    if isinstance(value, type) and issubclass(value, BaseException):
        return f"class {name}({', '.join(_name_of(b) for b in value.__bases__)})"
    if not callable(value):
        return f"{name} = {value_text(value)}"
    try:
        signature = inspect.signature(value)
    except (TypeError, ValueError):  # a protobuf message class: keyword arguments, one per field
        return f"{name}(**fields)"
    parameters = _parameters(signature)
    returns = ""
    if signature.return_annotation is not inspect.Signature.empty and not isinstance(value, type):
        returns = " -> " + _annotation(signature.return_annotation)
    line = f"{name}({', '.join(parameters)}){returns}"
    if len(line) <= WIDTH or not parameters:
        return line
    return f"{name}(\n" + "".join(f"    {p},\n" for p in parameters) + f"){returns}"


def first_paragraph(value) -> str:
    """The docstring's first paragraph on one line ('' when there is none)."""
    if not (callable(value) or isinstance(value, type)):
        return ""
    doc = inspect.getdoc(value) or ""
    return " ".join(line.strip() for line in doc.strip().split("\n\n", 1)[0].splitlines())


def section_of(name: str, value) -> Section:
    from smartstage.errors import SmartStageError

    if isinstance(value, type) and issubclass(value, SmartStageError):
        return ERRORS
    if name in NAMED_SECTIONS:
        return next(s for s in SECTIONS if s.title == NAMED_SECTIONS[name])
    module = getattr(value, "__module__", "") or ""
    for section in SECTIONS:
        if any(module == m or module.startswith(m + ".") for m in section.modules):
            return section
    raise LookupError(f"tools/apidoc.py: no section for {name!r} (defined in {module or 'no module'}); add its "
                      "module to a Section's modules, or the name to NAMED_SECTIONS")


def public_names() -> list[tuple[str, object]]:
    """(the name as the page shows it, the object) for smartstage.__all__ and smartstage.tf2.__all__."""
    smartstage = importlib.import_module("smartstage")
    tf2 = importlib.import_module("smartstage.tf2")
    names = [(name, getattr(smartstage, name)) for name in smartstage.__all__]
    return names + [(f"tf2.{name}", getattr(tf2, name)) for name in tf2.__all__]


def render() -> str:
    grouped: dict[str, list[tuple[str, object]]] = {s.title: [] for s in SECTIONS}
    for name, value in public_names():
        grouped[section_of(name, value).title].append((name, value))
    parts = [HEADER]
    for section in SECTIONS:
        entries = sorted(grouped[section.title], key=lambda entry: entry[0].lower())
        parts.append(f"## {section.title}\n\nGuide: {section.guides}.\n")
        for name, value in entries:
            # a plain fence: a signature is not a program (dataclass defaults read <factory>), so neither
            # tests/test_docs.py compiles it nor tests/test_doc_blocks.py runs it
            parts.append(f"### `{name}`\n\n```\n{signature_line(name, value)}\n```\n")
            summary = first_paragraph(value) or VALUE_NOTES.get(name, "")
            if summary:
                parts.append(summary + "\n")
    parts.append(FOOTER)
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.apidoc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help=f"exit 1 when {PAGE.relative_to(REPO_ROOT)} is not "
                        "what the code gives")
    args = parser.parse_args(argv)
    text = render()
    if not args.check:
        sys.stdout.write(text)
        return 0
    if PAGE.read_text() == text:
        return 0
    print(f"{PAGE.relative_to(REPO_ROOT)} is out of date: run `{COMMAND}`", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
