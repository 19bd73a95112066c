"""Hand-drawn stage graphs shared by the pass tests."""

from __future__ import annotations

import tensorflow as tf

from tests.builder import G, N


def fifo_stage(components, name="stage", dtypes=None):
    """A FIFOQueueV2 stage carrying `components` (input strings): buffer, put, take."""
    dtypes = dtypes or [tf.string] * len(components)
    return [
        N(f"{name}/buffer", "FIFOQueueV2", component_types=dtypes, shapes=[], capacity=2, shared_name=name),
        N(f"{name}/put", "QueueEnqueueV2", [f"{name}/buffer", *components], Tcomponents=dtypes),
        N(f"{name}/take", "QueueDequeueV2", [f"{name}/buffer"], component_types=dtypes),
    ]


def reader(name="reader", dtype=tf.string):
    """A stand-in for parsed input on the prefetch side: a stateless op of the right dtype."""
    return N(name, "Const", dtype=dtype, value=[b"a", b"b"] if dtype == tf.string else [1, 2])


def variable(name="w", shape=(10, 4)):
    return [N(name, "VariableV2", dtype=tf.float32, shape=list(shape)),
            N(f"{name}/read", "Identity", [name], T=tf.float32)]


def gather(name, params, ids, tindices=tf.int64):
    return [N(f"{name}/axis", "Const", dtype=tf.int32, value=0),
            N(name, "GatherV2", [params, ids, f"{name}/axis"], Tparams=tf.float32, Tindices=tindices, Taxis=tf.int32)]


def two_feature_graph():
    #   reader -> put ~~ take:0 -> hash ----------------> lookup(w) -> loss
    #                    take:1 -> concat(const) -> as_string
    return G(
        reader("r0"), reader("r1"),
        *fifo_stage(["r0", "r1"]),
        N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10),
        *variable("w"),
        *gather("lookup", "w/read", "hash"),
        N("loss", "Sum", ["lookup", "lookup/axis"], T=tf.float32, Tidx=tf.int32),
        N("xxx", "Const", dtype=tf.string, value=[b"xxx"]),
        N("concat/axis", "Const", dtype=tf.int32, value=0),
        N("concat", "ConcatV2", ["stage/take:1", "xxx", "concat/axis"], T=tf.string, N=2, Tidx=tf.int32),
        N("as_string", "Identity", ["concat"], T=tf.string),
    )


def staged_at_inputs(graph_def, inputs, name="stage"):
    """`graph_def` with a FIFO stage at `inputs`, the v1 way of naming a graph's inputs: the put carries the input
    nodes' outputs 0 and the take stands for them in every reader. What passes.partition_inputs gives must be
    what the partition of this stage gives (the reference of tests/passes/test_partition_inputs.py and
    tests/tf2/test_analysis_inputs.py)."""
    from smartstage.graph.names import input_source, parse_tensor_name

    port = {node: k for k, node in enumerate(inputs)}
    dtypes = [tf.as_dtype(next(n for n in graph_def.node if n.name == node).attr["dtype"].type) for node in inputs]
    out = type(graph_def)()
    out.CopyFrom(graph_def)  # the function library and versions too
    for node in out.node:
        new = []
        for s in node.input:
            src = input_source(s)
            if src not in port:
                new.append(s)
            elif s.startswith("^"):
                new.append(f"^{name}/take")
            else:
                new.append(f"{name}/take:{port[src]}" if parse_tensor_name(s).port == 0 else s)
        del node.input[:]
        node.input.extend(new)
    out.node.extend(fifo_stage(list(inputs), name, dtypes))
    return out
