"""One-line messages for errors the command line meets: TensorFlow's run errors, a graph without a stage.

    before:  smartstage: error: the graph failed to run (InvalidArgumentError): Graph execution error:
    after:   smartstage: error: the graph failed to run (InvalidArgumentError) at node 'needs_feed': You must
             feed a value for placeholder tensor 'needs_feed' with dtype float; give it a value with
             --feed needs_feed=VALUE (a number or a JSON list)
"""

from __future__ import annotations

import re

# Lines of TensorFlow's message that are framing, not the cause.
_FRAMING = re.compile(r"^(Graph execution error:|Detected at node|Node:|\[\[|File \"|Original stack trace|"
                      r"Traceback|\s*$)")
_NODE = re.compile(r"(?:Node: |Detected at node |node )'?([^'\s\]}]+)'?")
_UNFED = re.compile(r"must feed a value for placeholder tensor '([^']+)'")


def op_error_message(error) -> str:
    """`error` (a tf.errors.OpError) as one line: its type, the node it names, and its first line of cause."""
    text = (getattr(error, "message", "") or str(error)).strip()
    lines = [line.strip() for line in text.splitlines()]
    cause = next((line for line in lines if not _FRAMING.match(line)), lines[0] if lines else "")
    op = getattr(error, "op", None)
    node = getattr(op, "name", None)
    if not node:
        found = next((m.group(1) for line in lines for m in [_NODE.search(line)] if m), None)
        node = found
    where = f" at node {node!r}" if node else ""
    message = f"the graph failed to run ({type(error).__name__}){where}: {cause}"
    unfed = _UNFED.search(text)
    if unfed:
        name = unfed.group(1)
        message += (f"; the step feeds placeholder {name!r}: give it a value with --feed {name}=VALUE "
                    "(a number or a JSON list, fed in both runs)")
    return message


def no_stage_message(error, auto_stage: bool) -> str:
    """NoStageError as the command line's user needs it: the CLI's own --auto-stage flag, not a Python call."""
    if auto_stage:
        return str(error)
    text = str(error)
    note = text[text.index("; note: "):] if "; note: " in text else ""
    return ("the graph has no stage boundary (no put/take pair): run again with --auto-stage to insert a stage "
            "at every input source (iterator, queue dequeue, reader), or wrap the parsed features with "
            "smartstage.staged(...) where the graph is built" + note)
