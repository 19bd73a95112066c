"""Paths through a graph's inputs: how a pin reaches a node, how a moved node reaches the take.

    input_path(view, "loss", "w")          -> ["loss", "lookup", "w/read", "w"]
    pin_chain(view, partition.pinned, "loss") -> ("loss", "lookup", "w/read", "w")
"""

from __future__ import annotations

from collections import deque
from typing import Any, Mapping

from smartstage.graph.view import GraphView


def pin_chain(view: GraphView, pinned: Mapping[str, Any], name: str) -> tuple[str, ...]:
    """`name`, the input it inherited its pin through, and so on back to the pin's cause.

    Follows `Pin.via` while the partition recorded one; from a node outside the partition (upstream of
    the take) it takes the shortest input path to the cause in `view`.
    """
    pin = pinned[name]
    chain = [name]
    current, current_pin = name, pin
    while current_pin.via is not None and current != pin.cause:
        nxt = current_pin.via
        if nxt in chain:
            break
        if nxt in pinned:
            chain.append(nxt)
            current, current_pin = nxt, pinned[nxt]
            continue
        chain.extend(input_path(view, nxt, pin.cause) or [nxt, pin.cause])
        break
    if chain[-1] != pin.cause:
        chain.append(pin.cause)
    return tuple(dict.fromkeys(chain))


def input_path(view: GraphView, start: str, goal: str) -> list[str] | None:
    """The shortest path start <- ... <- goal walking inputs (data or control), both ends included."""
    if start not in view:
        return None
    parent: dict[str, str | None] = {start: None}
    todo = deque([start])
    while todo:
        name = todo.popleft()
        if name == goal:
            path = [name]
            while parent[path[-1]] is not None:
                path.append(parent[path[-1]])
            return list(reversed(path))
        for t in view.inputs(name):
            if t.node not in parent and t.node in view:
                parent[t.node] = name
                todo.append(t.node)
    return None
