"""A stage's prefetch body as a tf.data `map`: built with TensorFlow's Python API, copied into the graph.

    before:  it -> IteratorGetNext -> sqrt -> lookup(table) -> put          (the body: sqrt, lookup)
    after:   scratch graph: source(variant) -> from_variant -> map(f: sqrt, lookup(captured table)) -> <finish>
             copy_scratch(...) adds its nodes and functions to the edit log: source -> the real dataset,
             the captured placeholder -> the real table handle

Two passes put a body into a dataset this way: tfdata_service (the map then goes to tf.data service) and
fold_dataset (the map then feeds a prefetch, and the user's iterator reads it). Why a scratch graph and
not hand-written NodeDefs: a `MapDataset`'s function needs the body's FunctionDef, its output shapes and
the captured inputs wired as `other_arguments`; TensorFlow's own builders get all of that right for the
installed version. Only new nodes and functions are added, with deterministic names (TensorFlow numbers
scratch functions per process): optimizing the same graph twice gives the same graph.

Captured tensors: a body node that reads a handle made outside the body (a read-only table) reads it
inside the map through a capture; in the scratch graph a placeholder of the handle's dtype stands for
it, and copy_scratch wires the real handle in its place.
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from tensorflow.core.framework import function_pb2, graph_pb2, node_def_pb2

from smartstage.graph.edits import EditLog
from smartstage.graph.names import parse_tensor_name
from smartstage.graph.view import GraphView

SOURCE = "smartstage_dataset_source"     # the scratch graph's stand-in for the dataset variant
CAPTURE = "smartstage_dataset_capture"   # ... for a captured handle: <CAPTURE>_<k>


@dataclass(frozen=True)
class DatasetBody:
    """What runs inside the map: the read it replaces, the body nodes, what the map returns.

    read: the IteratorGetNext whose components the map receives; body: nodes copied into the map
    function (graph order); outputs: tensors the map returns, in order (a read output passes through);
    captures: tensors made outside the body that the body reads by reference (table handles); waits: body
    ops every output waits for (a check the step waited on through a control edge: it fails the element).
    """

    read: str
    body: tuple[str, ...]
    outputs: tuple[str, ...]
    captures: tuple[str, ...] = ()
    waits: tuple[str, ...] = ()


@dataclass(frozen=True)
class ScratchDataset:
    """The scratch graph and what copy_scratch needs to know of it."""

    graph_def: graph_pb2.GraphDef
    dataset: str                         # the last dataset tensor of the chain (scratch names)
    output_types: tuple[int, ...]        # the map's (and the chain's) element dtypes
    output_shapes: tuple[Any, ...]       # TensorShapeProto per element
    placeholders: dict[str, str] = field(default_factory=dict)  # scratch placeholder -> real tensor


def canonical(tensor: str) -> str:
    t = parse_tensor_name(tensor)
    return f"{t.node}:{t.port}"


def scratch_dataset_graph(view: GraphView, body: DatasetBody, scope: str,
                          finish: Callable[[Any], Any] = lambda ds: ds, *,
                          num_parallel_calls: int | None = None, deterministic: bool | None = None,
                          source_tensor: str = "", factory: str = "", rewrite_as_session: bool = False
                          ) -> ScratchDataset:
    """A scratch graph: a variant placeholder (SOURCE) -> map(body) -> finish(dataset).

        before:  body {sqrt(IteratorGetNext:0)}, outputs ("sqrt:0", "IteratorGetNext:1")
        after:   <scope>MapDataset (f: an import of the body), then what `finish` builds on it

    `finish(dataset)` runs in the scratch graph under `scope` and returns the dataset (or any graph
    element) the chain ends in. source_tensor: the real tensor SOURCE stands for (recorded in placeholders).

    factory: the name of a one-shot iterator's dataset_factory function. Then the whole chain is built
    inside a new factory function (the old factory's dataset, then the map and `finish`), each captured
    table is made inside it by a copy of its handle op (the same shared_name: the same table), and the
    scratch graph holds one OneShotIterator node whose dataset_factory names the new function.

    rewrite_as_session: the body is first rewritten by Grappler as a session rewrites the ops it runs
    (as_a_session_rewrites), so the map computes what the same ops compute in a session, bit for bit.
    """
    import tensorflow as tf  # the Python API only here: the analysis reads protos

    read = view.node(body.read)
    specs = tuple(tf.TensorSpec(tf.TensorShape(shape), tf.dtypes.as_dtype(dtype)) for dtype, shape in
                  zip(read.attr["output_types"].list.type, read.attr["output_shapes"].list.shape))
    nodes = graph_pb2.GraphDef()
    nodes.library.CopyFrom(view.graph_def.library)
    nodes.versions.CopyFrom(view.graph_def.versions)
    for name in body.body:
        node = nodes.node.add()
        node.CopyFrom(view.node(name))
        node.device = ""  # the dataset's runtime places it
        node.attr.pop("_class", None)  # colocation with nodes outside the function means nothing inside it
    wanted = sorted({canonical(t) for t in body.outputs if parse_tensor_name(t).node != body.read})
    if rewrite_as_session and wanted:
        nodes = as_a_session_rewrites(nodes, read, body, wanted)
    reads = {canonical(raw) for node in nodes.node for raw in node.input if not raw.startswith("^")}
    used = {t for t in reads if parse_tensor_name(t).node == body.read}
    placeholders = {SOURCE: source_tensor} if source_tensor else {}

    def computed_body(captured):
        def mapped_body(*components):
            produced, waits = {}, []
            if wanted or body.waits:
                mapped = {t: components[parse_tensor_name(t).port] for t in used}
                inner = tf.compat.v1.get_default_graph()  # the map's FuncGraph: import reads its own tensors
                mapped.update({t: inner.capture(outer) for t, outer in captured.items() if t in reads})
                results = tf.graph_util.import_graph_def(nodes, input_map=mapped, return_elements=wanted + list(body.waits),
                                                         name="body")
                produced, waits = dict(zip(wanted, results)), results[len(wanted):]
            outputs = tuple(components[parse_tensor_name(t).port] if parse_tensor_name(t).node == body.read
                            else produced[canonical(t)] for t in body.outputs)
            if waits:
                with tf.control_dependencies(waits):
                    outputs = tuple(tf.identity(t) for t in outputs)
            return outputs
        return mapped_body

    def chain(source, captured):
        dataset = tf.data.experimental.from_variant(source, specs)
        if body.body:
            dataset = dataset.map(computed_body(captured), num_parallel_calls=num_parallel_calls,
                                  deterministic=deterministic)
        return dataset, finish(dataset)

    graph = tf.Graph()
    with graph.as_default(), warnings.catch_warnings():
        # distribute() reads dataset.options(), which warns in graph mode that options live in the graph now
        warnings.filterwarnings("ignore", message="To make it possible to preserve tf.data options")
        if factory:
            spec, end = _factory_chain(tf, view, body, scope, factory, chain)
        else:
            source = tf.compat.v1.placeholder(tf.variant, [], name=SOURCE)
            captured = {}
            for k, tensor in enumerate(body.captures):
                dtype = view.dtype_of(parse_tensor_name(tensor))
                name = f"{CAPTURE}_{k}"
                captured[canonical(tensor)] = tf.compat.v1.placeholder(tf.dtypes.as_dtype(dtype), name=name)
                placeholders[name] = canonical(tensor)
            with tf.name_scope(scope):
                dataset, end = chain(source, captured)
                spec = dataset.element_spec
    variant = getattr(end, "_variant_tensor", None)
    flat = spec if isinstance(spec, tuple) else (spec,)
    return ScratchDataset(graph.as_graph_def(), variant.name if variant is not None else "",
                          tuple(s.dtype.as_datatype_enum for s in flat), tuple(s.shape.as_proto() for s in flat),
                          placeholders)


def as_a_session_rewrites(nodes: graph_pb2.GraphDef, read, body: DatasetBody, wanted: list[str]) -> graph_pb2.GraphDef:
    """The body as a session's Grappler leaves it (the default rewrites: arithmetic, constant folding, ...).

        before:  square(IteratorGetNext:0) / 100.0
        after:   square(IteratorGetNext:0) * 0.01     (what a session computes: a division by a constant
                                                       becomes a multiplication by its reciprocal)

    A session rewrites the graphs it runs; TensorFlow does not rewrite a dataset's functions that way. So
    that the folded ops give the values the same ops give in the step (and on the lanes), the body is
    rewritten here, with a stand-in placeholder for each read component and captured handle (restored
    after), and the outputs kept (Grappler's fetch nodes).
    """
    from tensorflow.core.framework import types_pb2
    from tensorflow.core.protobuf import config_pb2, meta_graph_pb2
    from tensorflow.python.grappler import tf_optimizer

    stand_in = {}  # "IteratorGetNext:1" / "hash_table:0" -> placeholder name
    graph = graph_pb2.GraphDef()
    graph.CopyFrom(nodes)
    types, shapes = read.attr["output_types"].list.type, read.attr["output_shapes"].list.shape
    for node in graph.node:
        for i, raw in enumerate(node.input):
            t = parse_tensor_name(raw)
            if t.is_control or (t.node != body.read and canonical(raw) not in {canonical(c) for c in body.captures}):
                continue
            key = canonical(raw)
            if key not in stand_in:
                stand_in[key] = f"smartstage_stand_in_{len(stand_in)}"
            node.input[i] = stand_in[key]
    for key, name in stand_in.items():
        placeholder = graph.node.add(name=name, op="Placeholder")
        if parse_tensor_name(key).node == body.read:
            placeholder.attr["dtype"].type = types[parse_tensor_name(key).port]
            placeholder.attr["shape"].shape.CopyFrom(shapes[parse_tensor_name(key).port])
        else:
            placeholder.attr["dtype"].type = types_pb2.DT_RESOURCE
            placeholder.attr["shape"].shape.unknown_rank = True  # Grappler's import needs the attr
    meta = meta_graph_pb2.MetaGraphDef()
    meta.graph_def.CopyFrom(graph)
    kept = {parse_tensor_name(t).node for t in wanted} | set(body.waits)
    meta.collection_def["train_op"].node_list.value.extend(sorted(kept))
    config = config_pb2.ConfigProto()
    config.graph_options.rewrite_options.min_graph_nodes = -1  # a small body is rewritten too, as in a session
    rewritten = tf_optimizer.OptimizeGraph(config, meta)
    back = {name: key for key, name in stand_in.items()}
    result = graph_pb2.GraphDef()
    result.library.CopyFrom(rewritten.library)
    result.versions.CopyFrom(nodes.versions)
    for node in rewritten.node:
        if node.name in back:
            continue
        copy = result.node.add()
        copy.CopyFrom(node)
        copy.device = ""
        copy.attr.pop("_class", None)  # colocation means nothing inside the map function
        for i, raw in enumerate(copy.input):
            t = parse_tensor_name(raw)
            if t.node in back:
                copy.input[i] = ("^" + parse_tensor_name(back[t.node]).node) if t.is_control else back[t.node]
    return result


def _factory_chain(tf, view: GraphView, body: DatasetBody, scope: str, factory: str, chain):
    """The chain inside a new one-shot dataset_factory (see scratch_dataset_graph); a OneShotIterator node
    named <scope>OneShotIterator reads it. Returns the element spec and None (no dataset tensor outside)."""
    from tensorflow.python.framework import function
    from tensorflow.python.ops import gen_dataset_ops

    library = graph_pb2.GraphDef()
    library.library.CopyFrom(view.graph_def.library)
    library.versions.CopyFrom(view.graph_def.versions)
    tf.graph_util.import_graph_def(library, name="")  # the old factory and what it calls, by their names
    handles = graph_pb2.GraphDef()
    for tensor in body.captures:
        handles.node.add().CopyFrom(view.node(parse_tensor_name(tensor).node))
        handles.node[-1].device = ""
        handles.node[-1].attr.pop("_class", None)
        if not handles.node[-1].attr["shared_name"].s:  # fold_dataset gives the table this name too
            handles.node[-1].attr["shared_name"].s = handles.node[-1].name.encode()
    specs = {}

    from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

    old = next(f for f in view.graph_def.library.function if f.signature.name == factory)
    old_graph, flat_names = function_def_to_graph_def(old)
    old_output = flat_names[old.ret[old.signature.output_arg[0].name]]

    # The old factory's nodes go into the new one as they are (a call of it would let Grappler fold the
    # dataset chain into a variant constant, which cannot be serialized).
    @function.Defun(capture_by_value=True)
    def new_factory():
        source = tf.graph_util.import_graph_def(old_graph, return_elements=[old_output], name="dataset")[0]
        made = tf.graph_util.import_graph_def(handles, return_elements=[canonical(t) for t in body.captures],
                                              name="captured") if body.captures else []
        captured = dict(zip((canonical(t) for t in body.captures), made))
        dataset, end = chain(source, captured)
        specs["spec"] = dataset.element_spec
        return end._variant_tensor  # noqa: SLF001

    new_factory.add_to_graph(tf.compat.v1.get_default_graph())
    spec = specs["spec"]
    flat = spec if isinstance(spec, tuple) else (spec,)
    gen_dataset_ops.one_shot_iterator(dataset_factory=new_factory, output_types=[s.dtype for s in flat],
                                      output_shapes=[s.shape for s in flat], name=scope + "OneShotIterator")
    return spec, None


def function_names(scratch: graph_pb2.GraphDef, known: dict[str, function_pb2.FunctionDef],
                   prefix: str) -> dict[str, str]:
    """New names for the scratch graph's functions, in the order the nodes reach them, so that optimizing
    the same graph twice gives the same names (TensorFlow numbers them per process). A function the
    graph already has, unchanged (one the body calls), is not copied.

        before:  __inference_Dataset_map_computed_body_42, reached first from <scope>MapDataset
        after:   {"__inference_Dataset_map_computed_body_42": "<prefix>_fn_0"}
    """
    functions = {f.signature.name: f for f in scratch.library.function}
    order: list[str] = []

    def reach(attrs) -> None:
        for value in attrs.values():
            for func in ([value.func] if value.HasField("func") else list(value.list.func)):
                if func.name in functions and func.name not in order:
                    order.append(func.name)
                    for node in functions[func.name].node_def:
                        reach(node.attr)
                    reach(func.attr)

    for node in scratch.node:
        reach(node.attr)
    order += sorted(set(functions) - set(order))
    prefix = re.sub(r"[^A-Za-z0-9_]", "_", prefix)
    new = [n for n in order if n not in known or known[n] != functions[n]]
    return {name: f"{prefix}_fn_{k}" for k, name in enumerate(new)}


def rename_functions(attrs, renamed: dict[str, str]) -> None:
    for value in attrs.values():
        for func in ([value.func] if value.HasField("func") else list(value.list.func)):
            func.name = renamed.get(func.name, func.name)
            rename_functions(func.attr, renamed)


def copy_scratch(log: EditLog, scratch: ScratchDataset, library: dict[str, function_pb2.FunctionDef],
                 prefix: str, device: str, *, skip: frozenset[str] = frozenset(),
                 node_name: Callable[[str], str] = lambda name: name) -> tuple[dict[str, str], dict[str, str]]:
    """Records in `log` the scratch graph's functions and nodes (but its placeholders and `skip`).

    Each placeholder's readers read the real tensor it stands for; every node gets `device` and the
    name node_name(scratch name). `library`: the functions the graph has, with those added so far
    (updated here). Returns scratch node name -> the name it got, and scratch function name -> its new name.

        before:  scratch {SOURCE, s/MapDataset(SOURCE, CAPTURE_0)}, placeholders {SOURCE: "batch", CAPTURE_0: "t"}
        after:   log adds s/MapDataset(batch, t:0) and its function, renamed <prefix>_fn_0
    """
    renamed = function_names(scratch.graph_def, library, prefix)
    functions = {f.signature.name: f for f in scratch.graph_def.library.function}
    for name in renamed:  # in the order of their new names: the library's own order varies
        copy = function_pb2.FunctionDef()
        copy.CopyFrom(functions[name])
        copy.signature.name = renamed[name]
        for node in copy.node_def:
            rename_functions(node.attr, renamed)
        log.add_function(copy)
        library[copy.signature.name] = copy
    stand_ins = set(scratch.placeholders) | {SOURCE}
    names = {n.name: node_name(n.name) for n in scratch.graph_def.node
             if n.name not in stand_ins and n.name not in skip}
    for node in scratch.graph_def.node:
        if node.name not in names:
            continue
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        copy.name = names[node.name]
        copy.device = device
        inputs = []
        for raw in node.input:
            t = parse_tensor_name(raw)
            if t.node in scratch.placeholders:
                inputs.append(scratch.placeholders[t.node])
            elif t.node in names:
                inputs.append(raw.replace(t.node, names[t.node], 1))
            else:
                inputs.append(raw)
        copy.input[:] = inputs
        if "_class" in copy.attr:  # colocation: with what the stand-in stands for, or the renamed scratch node
            located = []
            for entry in copy.attr["_class"].list.s:
                target = entry[len(b"loc:@"):].decode() if entry.startswith(b"loc:@") else None
                if target in scratch.placeholders:
                    target = parse_tensor_name(scratch.placeholders[target]).node
                elif target in names:
                    target = names[target]
                located.append(entry if target is None else b"loc:@" + target.encode())
            copy.attr["_class"].list.s[:] = located
        rename_functions(copy.attr, renamed)
        log.add_node(copy)
    return names, renamed


__all__ = ["CAPTURE", "DatasetBody", "SOURCE", "ScratchDataset", "canonical", "copy_scratch", "function_names",
           "rename_functions", "scratch_dataset_graph"]
