"""The committed stage_pb2.py matches stage.proto: every message, enum and field (name, number, label) the
.proto declares is what the generated module describes, and nothing more (regenerate as the .proto's
header says when this fails)."""

from __future__ import annotations

import re
from pathlib import Path

from smartstage.protos import stage_pb2

PROTO = Path(stage_pb2.__file__).with_name("stage.proto")
_BLOCK = re.compile(r"\b(message|enum)\s+(\w+)\s*\{")
_FIELD = re.compile(r"^\s*(repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;", re.M)
_ENUM_VALUE = re.compile(r"^\s*(\w+)\s*=\s*(\d+)\s*;", re.M)


def _declared(text: str) -> dict[str, set[tuple]]:
    """{type name: {(field, number, repeated)}} from the .proto text (comments stripped)."""
    text = re.sub(r"//[^\n]*", "", text)
    found: dict[str, set[tuple]] = {}
    for match in _BLOCK.finditer(text):
        depth, i = 1, match.end()
        while depth:
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        body = text[match.end():i - 1]
        body = re.sub(r"\b(message|enum)\s+\w+\s*\{[^{}]*\}", "", body)  # nested blocks are their own entries
        if match.group(1) == "enum":
            found[match.group(2)] = {(n, int(v), False) for n, v in _ENUM_VALUE.findall(body)}
        else:
            found[match.group(2)] = {(n, int(num), bool(rep)) for rep, _, n, num in _FIELD.findall(body)}
    return found


def _generated() -> dict[str, set[tuple]]:
    found: dict[str, set[tuple]] = {}

    def walk(message):
        found[message.name] = {(f.name, f.number, f.is_repeated) for f in message.fields}
        for enum in message.enum_types:
            found[enum.name] = {(v.name, v.number, False) for v in enum.values}
        for nested in message.nested_types:
            walk(nested)

    for message in stage_pb2.DESCRIPTOR.message_types_by_name.values():
        walk(message)
    for enum in stage_pb2.DESCRIPTOR.enum_types_by_name.values():
        found[enum.name] = {(v.name, v.number, False) for v in enum.values}
    return found


def test_the_generated_module_matches_the_proto():
    assert _declared(PROTO.read_text()) == _generated()


def test_the_parser_sees_a_missing_field():
    # The comparison can fail: a field added to the text and not regenerated is a difference.
    text = PROTO.read_text().replace("message FeedDef {", "message FeedDef {\n  string extra_field = 99;", 1)
    assert _declared(text) != _generated()
