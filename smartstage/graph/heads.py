"""The head/body rule of a prefetch side: which ops run once per batch, in order (the serial *head*).

    before:  GetNext -> decode -> hash -> lookup(table) -> put
    after:   head {GetNext}; body {decode, hash, lookup}          (LANES: the body runs on lanes in this process)
             head {GetNext, table, lookup}; body {decode, hash}   (INPUT_TASKS: the body runs on other tasks)

The head is every op whose result depends on how often or in which order it runs (input reads, random
ops, other stateful ops), with everything upstream of it and every op tied to it by a control edge or fed
a tensor that cannot cross from head to body. Two users apply it: the runtime's ordered lanes
(runtime/lanes/split.py, on a live tf.Graph) and the input_tasks pass (passes/input_tasks.py, on a
GraphView). They differ in one real way, named by a `HeadRule`: lanes run in the trainer's process and
share its state (handles, tables, variables), while a body on an input task would reach the trainer's
state across the network for every batch, so there state and what reads it stay in the head.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Callable, Iterable, TypeVar

from smartstage.graph.op_types import ORDER_FREE_STATEFUL_OPS, TABLE_READ_OPS

Node = TypeVar("Node")


@dataclass(frozen=True)
class HeadRule:
    """Which ops seed the head of a prefetch side.

    body_stateful: stateful op types the body may run on every batch (their result depends on their inputs only).
    shares_state: the body runs where the head's state lives (lanes in this process): ops that only make a
        handle stay out of the head. False (input tasks): ops that read a resource or a ref join the head.
    """

    body_stateful: frozenset[str]
    shares_state: bool

    def is_head_op(self, op_type: str, stateful: bool | None, *, is_handle: bool = False,
                   reads_state: bool = False) -> bool:
        """Whether an op must run once per batch, in order: stateful and not order-free (unknown: assume so).

            before:  LANES.is_head_op("IteratorGetNext", True)  /  LANES.is_head_op("LookupTableFindV2", True)
            after:   True  /  False (INPUT_TASKS: True, the table lives on the trainer)
        """
        if self.shares_state:
            if is_handle:
                return False
        elif reads_state:
            return True
        if stateful is None:
            return True
        return stateful and op_type not in self.body_stateful


# Ordered lanes: the body runs in this process, on several threads at once.
LANES = HeadRule(frozenset(ORDER_FREE_STATEFUL_OPS), shares_state=True)
# Input tasks: the body runs on other tasks; table lookups stay with their tables on the trainer.
INPUT_TASKS = HeadRule(frozenset(ORDER_FREE_STATEFUL_OPS - TABLE_READ_OPS), shares_state=False)


def close_head(side: AbstractSet[Node], seeds: Iterable[Node], upstream: Callable[[set[Node]], Iterable[Node]],
               joins: Callable[[Node, set[Node]], bool]) -> set[Node]:
    """The head grown from `seeds` to a fixpoint within `side`.

    upstream(head): the head and everything it reads (the caller leaves out what must not join, such as
    shared handles); joins(node, head): whether a node outside the head must join it (a control edge from
    the head, or an input from the head that cannot cross to the body).

        before:  seeds {GetNext}, side {filenames -> dataset -> iterator -> GetNext -> decode}
        after:   {filenames, dataset, iterator, GetNext}   (decode reads a crossable tensor: body)
    """
    head = set(seeds)
    while True:
        grown = set(upstream(head)) & side
        for node in side - grown:
            if joins(node, grown):
                grown.add(node)
        if grown == head:
            return head
        head = grown


__all__ = ["INPUT_TASKS", "LANES", "HeadRule", "close_head"]
