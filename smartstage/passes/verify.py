"""Invariants every graph must hold after every pass.

    verify_graph(graph_def, stages)   # raises VerificationError naming the broken node, or returns the view

1. node names are unique and every input resolves to a node (and, where the op is known, to an output it has);
2. the graph is acyclic;
3. every stage's put, take and buffer agree on the boundary dtypes, and the put's inputs have those dtypes.
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from smartstage.errors import GraphError, VerificationError
from smartstage.graph.view import GraphView
from smartstage.graph.op_types import dtype_name
from smartstage.graph.names import input_source
from smartstage.graph.stages import FIFO, StageBoundary


def verify_graph(graph_def: graph_pb2.GraphDef, stages: list[StageBoundary] = (), *,
                 base: GraphView | None = None, edited=None) -> GraphView:
    """Checks the invariants and returns the view of `graph_def`.

    With `base` (the view of the graph before a pass) and `edited` (the nodes the pass changed, same
    node set otherwise), only what the edits can break is checked: their inputs resolve, and no cycle
    runs through them (any new cycle must contain an edited node).
    """
    try:
        incremental = base is not None and edited is not None and len(graph_def.node) == len(base)
        view = GraphView(graph_def, base=base, changed=edited) if incremental else GraphView(graph_def)
        view.check_inputs(edited if incremental else None)
        if incremental:
            # Passes keep a sorted graph sorted: then one sweep proves it acyclic. Otherwise only the
            # edited nodes that read against the base's order need a cycle search.
            if not (base.in_written_order() and view.in_written_order()):
                view.check_acyclic(_backward_heads(view, base, edited))
        else:
            view.order()  # one sweep when sorted, else a depth-first sort (naming any cycle)
    except GraphError as e:
        raise VerificationError(str(e)) from None
    readers = list(edited) if incremental else list(view.names())
    for stage in stages:
        _verify_stage(view, stage, readers)
    return view


def _backward_heads(view: GraphView, base: GraphView, edited) -> list[str]:
    """The edited nodes that read a node placed after them in the base graph's topological order.

    Unedited nodes kept their inputs, so their edges follow that order; a cycle cannot follow it all
    the way round, so every new cycle enters one of these nodes through such an edge: only they need a
    cycle search (a pass that moves a put to the end of the graph names just the put).
    """
    rank = base.ranks()
    heads = []
    for name in edited:
        own = rank.get(name)
        if own is None or any(rank.get(src, own) >= own for src in map(input_source, view.raw_inputs(name))):
            heads.append(name)
    return heads


def _types(view: GraphView, name: str, keys: tuple[str, ...]) -> list[int] | None:
    node = view.node(name)
    for key in keys:
        if key in node.attr:
            return list(node.attr[key].list.type)
    return None


def _verify_stage(view: GraphView, stage: StageBoundary, readers: list[str]) -> None:
    for name in (stage.put, stage.take):
        if name not in view:
            raise VerificationError(f"stage {stage.name!r}: node {name!r} is missing after the rewrite")
    put_types = _types(view, stage.put, ("Tcomponents", "dtypes"))
    take_types = _types(view, stage.take, ("component_types", "dtypes"))
    if put_types is not None and take_types is not None and put_types != take_types:
        raise VerificationError(
            f"stage {stage.name!r}: the put carries [{_names(put_types)}] but the take gives [{_names(take_types)}]")
    if stage.buffer and stage.buffer in view:
        buffer_types = _types(view, stage.buffer, ("component_types",))
        if buffer_types is not None and take_types is not None and buffer_types != take_types:
            raise VerificationError(f"stage {stage.name!r}: buffer {stage.buffer!r} holds [{_names(buffer_types)}] "
                                    f"but the take gives [{_names(take_types)}]")
    inputs = view.data_inputs(stage.put)
    carried = inputs[1:] if stage.kind == FIFO else inputs
    if put_types is not None:
        if len(carried) != len(put_types):
            raise VerificationError(f"stage {stage.name!r}: the put has {len(carried)} inputs for "
                                    f"{len(put_types)} component types")
        for t, expected in zip(carried, put_types):
            actual = view.dtype_of(t)
            if actual is not None and actual % 100 != expected % 100:
                raise VerificationError(f"stage {stage.name!r}: put input {t} is {dtype_name(actual)}, "
                                        f"but the buffer expects {dtype_name(expected)}")
    if stage.buffer and stage.buffer in view and put_types is not None:
        shapes = view.node(stage.buffer).attr["shapes"].list.shape if "shapes" in view.node(stage.buffer).attr else []
        if shapes and len(shapes) != len(carried):
            raise VerificationError(f"stage {stage.name!r}: buffer {stage.buffer!r} declares {len(shapes)} shapes "
                                    f"for {len(carried)} components")
        for t, declared in zip(carried if shapes else (), shapes):
            actual = view.output_shape(t)
            if actual is not None and not _compatible(actual, declared):
                raise VerificationError(f"stage {stage.name!r}: put input {t} has shape {_shape(actual)}, but the "
                                        f"buffer declares {_shape(declared)}")
    if take_types is not None:
        take, raw_inputs = stage.take, view.raw_inputs
        for name in readers:
            if not any(s.startswith(take) for s in raw_inputs(name)):
                continue  # parse only the inputs of nodes that may read the take
            for src, port in view.inputs(name):
                if src == take and port >= len(take_types):
                    raise VerificationError(f"node {name!r} reads {stage.take}:{port}, but the take has only "
                                            f"{len(take_types)} outputs")


def _names(types: list[int]) -> str:
    return ", ".join(dtype_name(t) for t in types)


def _compatible(a, b) -> bool:
    if a.unknown_rank or b.unknown_rank:
        return True
    return len(a.dim) == len(b.dim) and all(x.size < 0 or y.size < 0 or x.size == y.size for x, y in zip(a.dim, b.dim))


def _shape(shape) -> str:
    return "<unknown>" if shape.unknown_rank else "[" + ", ".join(str(d.size) if d.size >= 0 else "?" for d in shape.dim) + "]"
