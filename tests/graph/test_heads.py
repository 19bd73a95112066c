"""The head/body rule of a prefetch side (graph/heads.py): the seeds of each HeadRule, and the fixpoint.

The runtime's lanes (LANES) and the input_tasks pass (INPUT_TASKS) share the rule; they differ only where a
body on another task cannot reach the trainer's state (a table lookup, a read of a variable).
"""

from __future__ import annotations

import pytest

from smartstage.graph.heads import INPUT_TASKS, LANES, close_head


@pytest.mark.parametrize("op_type, stateful, is_handle, reads_state, lanes, input_tasks", [
    ("IteratorGetNext",     True,  False, True,  True,  True),   # an input read: once per batch, in order
    ("RandomUniform",       True,  False, False, True,  True),   # a random op: its draws depend on the order
    ("StringToHashBucketFast", False, False, False, False, False),  # stateless: the body
    ("LookupTableFindV2",   True,  False, True,  False, True),   # read-only lookup: lanes share the table
    ("HashTableV2",         True,  True,  False, False, True),   # a handle: shared in-process, on the trainer else
    ("ReadVariableOp",      True,  False, True,  True,  True),   # a variable's value changes between batches
    ("Identity",            False, False, True,  False, True),   # reads a ref: stays with it on another task
    ("Assert",              True,  False, False, False, False),  # order-free: every body run may check
    ("MyCustomOp",          None,  False, False, True,  True),   # unknown to this TensorFlow: assume the worst
])
def test_the_seeds_of_each_rule(op_type, stateful, is_handle, reads_state, lanes, input_tasks):
    assert LANES.is_head_op(op_type, stateful, is_handle=is_handle, reads_state=reads_state) is lanes
    assert INPUT_TASKS.is_head_op(op_type, stateful, is_handle=is_handle, reads_state=reads_state) is input_tasks


# files -> dataset -> make_iterator <- iterator (a handle) -> get_next (seed) -> decode -> hash -> (put)
#                                                  get_next -(control)-> assert_ok
#                                                  get_next:1 (a variant: cannot cross) -> unpack
INPUTS = {
    "files": [], "dataset": ["files"], "iterator": [], "make_iterator": ["dataset", "iterator"],
    "get_next": ["iterator"], "decode": ["get_next"], "hash": ["decode"], "assert_ok": [], "unpack": ["get_next"],
}
CONTROL = {"assert_ok": ["get_next"]}
UNCROSSABLE = {("unpack", "get_next")}


def _upstream(nodes: set[str]) -> set[str]:
    seen, todo = set(), list(nodes)
    while todo:
        node = todo.pop()
        if node not in seen:
            seen.add(node)
            todo.extend(INPUTS[node] + CONTROL.get(node, []))
    return seen


def _joins(node: str, head: set[str]) -> bool:
    return any(c in head for c in CONTROL.get(node, [])) or any(
        i in head and (node, i) in UNCROSSABLE for i in INPUTS[node])


def test_the_head_grows_upstream_and_over_control_edges_and_uncrossable_tensors():
    head = close_head(set(INPUTS), {"get_next"}, _upstream, _joins)
    assert head == {"iterator", "get_next", "assert_ok", "unpack"}   # decode, hash: the body


def test_a_side_without_seeds_has_no_head():
    assert close_head(set(INPUTS), set(), _upstream, _joins) == set()


def test_upstream_may_leave_shared_handles_out():
    # the runtime's lanes share the iterator's handle: it does not join the head by being read
    head = close_head(set(INPUTS), {"get_next"}, lambda nodes: _upstream(nodes) - {"iterator"}, _joins)
    assert head == {"get_next", "assert_ok", "unpack"}
