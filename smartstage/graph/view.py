"""GraphView: a thin, read-only index over a GraphDef.

Tensor names are parsed by smartstage.graph.names, the one place that does ("node", "node:port", "^control").

    view = GraphView(graph_def)
    view.data_inputs("loss")      # [TensorName(node='lookup', port=0), ...]
    view.fanouts("take")          # [Fanout(consumer='hash', index=0, port=1), ...]

The view never edits the GraphDef; passes build a new one (see smartstage.passes.rewrite).
"""

from __future__ import annotations

from typing import Container, Iterable, Iterator, Sequence

from tensorflow.core.framework import graph_pb2, node_def_pb2

from smartstage.errors import GraphError
from smartstage.graph.names import (CONTROL_PORT, Fanout, TensorName, input_source, new_tuple, parse_input,
                                    parse_tensor_name)
from smartstage.graph.op_types import output_dtypes

_NEXT_ITERATION_OPS = ("NextIteration", "RefNextIteration")
_MERGE_OPS = ("Merge", "RefMerge")


def _without(mapping: dict, keys: set) -> dict:
    """A copy of `mapping` without `keys` (copied whole, then pruned: cheaper than a filtering
    comprehension when few keys go)."""
    copy = dict(mapping)
    for key in keys:
        copy.pop(key, None)
    return copy


class GraphView:
    """Read-only index of a GraphDef: nodes by name and position, inputs parsed once, fanouts with ports.

    Raises GraphError for duplicate or empty node names; missing inputs are reported by `check_inputs()`.
    `GraphView(new_graph_def, base=old_view, changed=names)` reuses the parsed inputs of every node
    outside `changed`: a pass that edits a few nodes of a large graph re-parses only those.
    """

    def __init__(self, graph_def: graph_pb2.GraphDef, base: "GraphView | None" = None,
                 changed: Iterable[str] | None = None):
        self.graph_def = graph_def
        # Names, op types and input strings are read up front; NodeDefs are fetched by position when asked
        # for: wrapping every NodeDef of a 10^6-node graph in a Python object costs more than the analysis.
        raw = None
        if base is not None and len(base) == len(graph_def.node):
            nodes = graph_def.node
            names = [node.name for node in nodes]
            position = {name: i for i, name in enumerate(names)}
            stale = set(changed or ())
            op_of = dict(base._op_of)  # copied whole, then corrected where the graphs differ
            for name in op_of.keys() - position.keys():
                del op_of[name]
            for name in (position.keys() - op_of.keys()) | (stale & position.keys()):
                op_of[name] = nodes[position[name]].op
            self._op_of = op_of
        else:  # one sweep over the NodeDefs reads names, op types and input strings (parsed on demand)
            names, ops, raw = [], [], []
            for node in graph_def.node:
                names.append(node.name)
                ops.append(node.op)
                raw.append(tuple(node.input))
            self._op_of = dict(zip(names, ops))
            position = {name: i for i, name in enumerate(names)}
        if len(position) != len(names) or "" in position:
            self._raise_bad_names(graph_def)
        self._names = names
        self._position_of = position
        self._node_cache: dict[str, node_def_pb2.NodeDef] = {}
        self._dtypes: dict[str, list[int] | None] = {}  # output_dtypes(), per node asked about
        self._inputs: dict[str, list[TensorName]] = {}
        self._raw: dict[str, tuple[str, ...]] = {} if raw is None else dict(zip(names, raw))
        if base is not None:  # the base's parsed inputs, output types and input strings, but the changed nodes
            gone = set(changed or ()) | (base._position_of.keys() - position.keys())
            self._inputs = _without(base._inputs, gone)
            self._dtypes = _without(base._dtypes, gone)
            if raw is None:
                self._raw = _without(base._raw, gone)
        self._fanouts: dict[str, list[Fanout]] | None = None
        self._by_op: dict[str, list[str]] | None = None  # nodes_of_type()'s index
        self._scanned = False  # nodes_of_type() was asked once
        self._order: list[str] | None = None
        self._ranks: dict[str, int] | None = None
        self._sorted: bool | None = None  # in_written_order()
        self._dangling: list[str] = []

    @staticmethod
    def _raise_bad_names(graph_def) -> None:
        seen: dict[str, str] = {}
        for node in graph_def.node:
            if not node.name:
                raise GraphError(f"a node of op type {node.op!r} has an empty name; every NodeDef needs a unique name")
            if node.name in seen:
                raise GraphError(f"duplicate node name {node.name!r} (op types {seen[node.name]} and {node.op}); "
                                 "node names must be unique: rename one of them")
            seen[node.name] = node.op

    # -- nodes -------------------------------------------------------------------------------
    def __contains__(self, name: str) -> bool:
        return name in self._position_of

    def __len__(self) -> int:
        return len(self._names)

    def names(self) -> Iterator[str]:
        return iter(self._names)

    def node(self, name: str) -> node_def_pb2.NodeDef:
        node = self._node_cache.get(name)
        if node is None:
            try:
                node = self._node_cache[name] = self.graph_def.node[self._position_of[name]]
            except KeyError:
                raise GraphError(f"the graph has no node named {name!r}") from None
        return node

    def op(self, name: str) -> str:
        try:
            return self._op_of[name]
        except KeyError:
            raise GraphError(f"the graph has no node named {name!r}") from None

    def position(self, name: str) -> int:
        """The node's index in the GraphDef: the tie-breaker that makes every order deterministic."""
        return self._position_of[name]

    def nodes_of_type(self, ops: Iterable[str]) -> list[str]:
        """Names of the nodes whose op type is in `ops`, in graph order. The first call scans the op types; the
        second builds an index by op type that answers every later one (passes ask a large graph a few times)."""
        by_op = self._by_op
        if by_op is None and not self._scanned:
            self._scanned = True
            ops = frozenset(ops)
            found = [name for name, op in self._op_of.items() if op in ops]
            found.sort(key=self._position_of.__getitem__)  # a derived view's dict is in its base's order
            return found
        if by_op is None:
            by_op = self._by_op = {}
            for name, op in self._op_of.items():
                names = by_op.get(op)
                if names is None:
                    by_op[op] = [name]
                else:
                    names.append(name)
        found = [name for op in frozenset(ops) for name in by_op.get(op, ())]
        found.sort(key=self._position_of.__getitem__)  # a derived view's dict is in its base's order
        return found

    def read_all(self) -> None:
        """Reads the input strings of every node in one sweep over the GraphDef (cheaper than node by node;
        parsing them waits until a node's inputs are asked for)."""
        raw = self._raw
        missing = len(self._names) - len(raw)
        if missing == 0:
            return
        if missing < len(self._names) // 4:  # a view derived from another: fetch just the edited nodes
            nodes, position = self.graph_def.node, self._position_of
            for name in self._names:
                if name not in raw:
                    raw[name] = tuple(nodes[position[name]].input)
            return
        for name, node in zip(self._names, self.graph_def.node):
            if name not in raw:
                raw[name] = tuple(node.input)

    def raw_input_table(self) -> dict[str, tuple[str, ...]]:
        """Every node's input strings by name (read_all() first), for sweeps that look up 10^6 of them."""
        self.read_all()
        return self._raw

    def raw_inputs(self, name: str) -> tuple[str, ...]:
        """The input strings of `name` as the NodeDef has them ("x", "x:1", "^x"); see input_source()."""
        raw = self._raw.get(name)
        if raw is None:
            raw = self._raw[name] = tuple(self.node(name).input)
        return raw

    def inputs(self, name: str) -> list[TensorName]:
        """All inputs of `name` in NodeDef order: data inputs, then control inputs."""
        parsed = self._inputs.get(name)
        if parsed is None:
            parsed = self._inputs[name] = [parse_input(s) for s in self.raw_inputs(name)]
        return parsed

    def data_inputs(self, name: str) -> list[TensorName]:
        return [t for t in self.inputs(name) if t.port != CONTROL_PORT]

    def control_inputs(self, name: str) -> list[str]:
        return [t.node for t in self.inputs(name) if t.port == CONTROL_PORT]

    def input_nodes(self, name: str) -> set[str]:
        return {t.node for t in self.inputs(name)}

    def fanouts(self, name: str) -> list[Fanout]:
        """Every use of `name`'s outputs and of `name` as a control input, in graph order."""
        if self._fanouts is None:
            self._build_fanouts()
        return self._fanouts.get(name, ())

    def _build_fanouts(self) -> None:
        fanouts: dict[str, list[Fanout]] = {}
        self.read_all()
        inputs = self.inputs
        for consumer in self._names:  # graph order, whatever order the inputs were parsed in
            for index, (src, port) in enumerate(inputs(consumer)):
                bucket = fanouts.get(src)
                if bucket is None:
                    fanouts[src] = [new_tuple(Fanout, (consumer, index, port))]
                else:
                    bucket.append(new_tuple(Fanout, (consumer, index, port)))
        self._fanouts = fanouts

    def consumers(self, name: str) -> list[str]:
        """Distinct consumers of `name` (data or control), in graph order."""
        seen: dict[str, None] = {}
        for f in self.fanouts(name):
            seen.setdefault(f.consumer, None)
        return list(seen)

    # -- checks and orders -------------------------------------------------------------------
    def missing_inputs(self, names: Iterable[str] | None = None) -> list[tuple[str, str]]:
        """(node, input) pairs whose input names no node of the graph (among `names`, or all nodes)."""
        nodes = self._position_of
        if names is None:
            self.order()  # its sweep notes inputs that name no node
            names = self._dangling
        raw_inputs = self.raw_inputs
        return [(name, s) for name in names for s in raw_inputs(name) if input_source(s) not in nodes]

    def check_inputs(self, names: Iterable[str] | None = None) -> None:
        missing = self.missing_inputs(names)
        if missing:
            node, inp = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise GraphError(
                f"node {node!r} reads {inp!r}, but the graph has no node {parse_tensor_name(inp).node!r}{more}; "
                "export the whole graph, or remove the dangling input"
            )

    def check_acyclic(self, roots: Iterable[str] | None = None) -> None:
        """GraphError naming a cycle, if one is reachable backwards from `roots` (default: all nodes).

        Only the NextIteration -> Merge back edges of v1 while loops may close a loop.
        """
        done: set[str] = set()
        nodes, raw_inputs = self._position_of, self.raw_inputs
        for root in (self._names if roots is None else roots):
            if root in done:
                continue
            path = [root]
            on_path = {root}
            iters = [map(input_source, raw_inputs(root))]
            while iters:
                name = path[-1]
                for src in iters[-1]:
                    if src in done or src not in nodes or self._is_back_edge(src, name):
                        continue
                    if src in on_path:
                        cycle = path[path.index(src):] + [src]
                        raise GraphError(f"the graph has a cycle: {' -> '.join(reversed(cycle))}; a GraphDef must "
                                         "be acyclic (only the NextIteration -> Merge back edges of tf.while_loop "
                                         "may close a loop)")
                    path.append(src)
                    on_path.add(src)
                    iters.append(map(input_source, raw_inputs(src)))
                    break
                else:
                    done.add(name)
                    on_path.discard(name)
                    path.pop()
                    iters.pop()

    def order(self) -> list[str]:
        """Every node in a topological order: the GraphDef's own order when it already is one (TensorFlow
        writes graphs that way, and so does SmartStage), else topological_order(): each node as soon as
        its inputs are placed, otherwise in graph order.
        GraphError names a cycle. Inputs that name no node are ignored here (see check_inputs)."""
        if self._order is None and not self.in_written_order():
            self._order = self.topological_order()
        return self._order

    def in_written_order(self) -> bool:
        """Whether the GraphDef lists every node after its inputs (one sweep over the input strings, which
        also notes the inputs that name no node). A graph in that order is acyclic."""
        if self._sorted is None:
            self.read_all()
            nodes, raw, seen = self._position_of, self._raw, set()
            in_order = True
            dangling = []
            for name in self._names:
                for s in raw[name]:
                    if s not in seen:  # a plain "x" is the node's own name: one lookup settles it
                        src = input_source(s)
                        if src in seen:
                            continue
                        if src not in nodes:
                            dangling.append(name)
                        elif not self._is_back_edge(src, name):
                            in_order = False
                seen.add(name)
            self._dangling = list(dict.fromkeys(dangling))
            self._sorted = in_order
            if in_order:
                self._order = list(self._names)
        return self._sorted

    def ranks(self) -> dict[str, int]:
        """Each node's index in order()."""
        if self._ranks is None:
            self._ranks = {name: i for i, name in enumerate(self.order())}
        return self._ranks

    def topological_order(self, names: Iterable[str] | None = None) -> list[str]:
        """`names` (default: all nodes) ordered so that each comes after its inputs among them, and otherwise
        in graph order: a node is placed as soon as its inputs are, so a GraphDef with a few nodes out of
        place is repaired locally. GraphError names a cycle."""
        if names is None:
            chosen: Sequence[str] = self._names
            members: Container[str] = self._position_of
            self.read_all()
        else:
            chosen = sorted(set(names), key=self.position)
            members = set(chosen)
        # A depth-first walk over the raw input strings (10^6 edges: no parsing), roots in graph order:
        # when the graph is nearly sorted, every input is placed already and the walk is one sweep.
        raw_inputs = self._raw.__getitem__ if names is None else self.raw_inputs  # read_all() above
        placed: set[str] = set()
        order: list[str] = []
        for root in chosen:
            if root in placed:
                continue
            for s in raw_inputs(root):  # the common case first: every input placed already
                if s in placed:
                    continue
                if s[0] == "^":  # input_source(), inlined here and below: 10^6 calls on a large graph
                    s = s[1:]
                elif ":" in s:
                    node, _, port = s.rpartition(":")
                    if port.isdigit():
                        s = node
                if s not in placed and s in members:
                    break
            else:
                placed.add(root)
                order.append(root)
                continue
            path, on_path = [root], {root}
            stack = [iter(raw_inputs(root))]
            while stack:
                for s in stack[-1]:
                    if s in placed:  # a plain "x" is the node's own name: one lookup settles it
                        continue
                    if s[0] == "^":
                        s = s[1:]
                    elif ":" in s:
                        node, _, port = s.rpartition(":")
                        if port.isdigit():
                            s = node
                    if s in placed or s not in members:
                        continue
                    if self._is_back_edge(s, path[-1]):
                        continue
                    if s in on_path:
                        self.check_acyclic([s])
                        raise GraphError("the graph has a cycle")  # check_acyclic names it; a safety net
                    path.append(s)
                    on_path.add(s)
                    stack.append(iter(raw_inputs(s)))
                    break
                else:
                    stack.pop()
                    done = path.pop()
                    on_path.discard(done)
                    placed.add(done)
                    order.append(done)
        return order

    def _is_back_edge(self, src: str, dst: str) -> bool:
        """A v1 while loop's NextIteration -> Merge edge: the one cycle TensorFlow allows."""
        return self._op_of[src] in _NEXT_ITERATION_OPS and self._op_of[dst] in _MERGE_OPS

    def ancestors(self, roots: Iterable[str], stop: set[str] | None = None) -> set[str]:
        """Every node some root depends on (data or control), roots included; `stop` nodes are not entered."""
        stop = stop or set()
        seen: set[str] = set()
        todo = [r for r in roots if r not in stop]
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            for t in self.inputs(name):
                if t.node not in seen and t.node not in stop and t.node in self._position_of:
                    todo.append(t.node)
        return seen

    # -- types -------------------------------------------------------------------------------
    def output_dtypes(self, name: str) -> list[int] | None:
        types = self._dtypes.get(name, False)
        if types is False:
            types = self._dtypes[name] = output_dtypes(self.node(name))
        return types

    def dtype_of(self, tensor: TensorName) -> int | None:
        types = self.output_dtypes(tensor.node)
        if types is None or tensor.port >= len(types):
            return None
        return types[tensor.port]

    def output_shape(self, tensor: TensorName):
        """The `_output_shapes` entry of a tensor (a TensorShapeProto), or None."""
        node = self.node(tensor.node)
        if "_output_shapes" in node.attr:
            shapes = node.attr["_output_shapes"].list.shape
            if tensor.port < len(shapes):
                return shapes[tensor.port]
        return None

    # -- interoperability ------------------------------------------------------------------------
    def to_networkx(self):
        """The graph as a networkx.MultiDiGraph: one edge per input, from producer to consumer.

            before:  view.inputs("loss")                        # SmartStage's own index
            after:   nx.descendants(view.to_networkx(), "stage/take")   # any networkx algorithm

        Node attribute `op` (the op type); edge key: the input's index on the consumer; edge attributes
        `port` (the producer's output, -1 for a control edge) and `control`. Inputs naming a missing node
        add that node without an `op`.
        """
        import networkx as nx  # imported here: nothing else in the optimizer needs it

        graph = nx.MultiDiGraph()
        graph.add_nodes_from((name, {"op": self.op(name)}) for name in self.names())
        for name in self.names():
            for index, (src, port) in enumerate(self.inputs(name)):
                graph.add_edge(src, name, key=index, port=port, control=port == CONTROL_PORT)
        return graph
