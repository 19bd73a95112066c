"""Synthetic training graphs of 10^4 to 10^6 nodes for the scaling benchmark.

    graph_def = training_graph(100_000)        # a GraphDef of about 100,000 nodes
    path = cached_graph(out_dir, 1_000_000)    # generated once, kept as <out_dir>/graphs/train-1000000.pb

The graph is what a recommendation model with many feature columns looks like after
tf.compat.v1 built it, at any size:

    reader -> decode_csv(F columns) -> stage put ~~ take -> feature f: preprocessing -> embedding(w_f)
                                                          -> contribution_f -> AddN -> + bias -> loss
    gradients: loss -> d logits -> every feature's embedding and weight gradients -> Adagrad updates
    train_op = group(every update)

Every node is a real TensorFlow op built by TensorFlow itself: one template per feature kind
(hashed, vocabulary lookup, multi-valued sparse, bucketized dense; each with its preprocessing,
embedding lookup, gradients and Adagrad update) is built once with the tf.compat.v1 API, then
copied F times under the prefix `f<i>/`, its stand-in inputs wired to the stage's take and to the
shared d(loss)/d(logits). The shared part (reader, stage, sum, loss, its gradient, train_op) is
built with the API for the exact F. Copying NodeDefs makes a 10^6-node graph in seconds, where
building it op by op in Python would take many minutes; the result imports with
tf.graph_util.import_graph_def like any exported graph.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

import smartstage as ss

TAKE_STUB = "take_stub"
GRAD_STUB = "grad_stub"
KINDS = ("hashed", "vocabulary", "multivalent", "dense")
BATCH = None  # the batch dimension stays unknown, as in a real input pipeline
EMBEDDING_DIM = 8


@dataclass(frozen=True)
class Template:
    """One feature kind built by TensorFlow: its NodeDefs, the column dtype it reads, its outputs."""

    kind: str
    nodes: tuple[node_def_pb2.NodeDef, ...]
    column_dtype: tf.DType
    contribution: str  # tensor name (template scope) of the feature's [B, 1] logit contribution
    update: str  # op name of its Adagrad update


def _feature(kind: str, column: tf.Tensor) -> tuple[tf.Tensor, list[tf.Variable]]:
    """The preprocessing and model part of one feature: [B, 1] contribution and its variables."""
    init = tf.compat.v1.random_uniform_initializer(-0.05, 0.05, seed=1)
    buckets = 1000
    table = tf.compat.v1.get_variable("embedding", [buckets, EMBEDDING_DIM], initializer=init)
    weight = tf.compat.v1.get_variable("weight", [EMBEDDING_DIM, 1], initializer=init)
    if kind == "hashed":
        ids = tf.strings.to_hash_bucket_fast(column, buckets, name="hash")
        embedded = tf.nn.embedding_lookup(table, ids, name="embed")
    elif kind == "vocabulary":
        initializer = tf.lookup.TextFileInitializer(
            "vocabulary.txt", tf.string, tf.lookup.TextFileIndex.WHOLE_LINE,
            tf.int64, tf.lookup.TextFileIndex.LINE_NUMBER, vocab_size=buckets - 10, name="vocabulary_init")
        lookup = tf.compat.v1.lookup.StaticHashTable(initializer, default_value=-1, name="vocabulary")
        found = lookup.lookup(column, name="lookup")
        oov = tf.strings.to_hash_bucket_fast(column, 10, name="oov") + (buckets - 10)
        ids = tf.where(found >= 0, found, oov, name="ids")
        embedded = tf.nn.embedding_lookup(table, ids, name="embed")
    elif kind == "multivalent":
        split = tf.compat.v1.string_split(column, sep="|")
        ids = tf.strings.to_hash_bucket_fast(split.values, buckets, name="hash")
        sparse = tf.SparseTensor(split.indices, ids, split.dense_shape)
        embedded = tf.nn.safe_embedding_lookup_sparse(table, sparse, combiner="mean", name="embed")
    elif kind == "dense":
        filled = tf.where(tf.math.is_nan(column), tf.zeros_like(column), column, name="fill")
        normalized = (tf.math.log1p(tf.maximum(filled, 0.0)) - 2.0) / 1.5
        bucket = tf.cast(tf.raw_ops.Bucketize(input=filled, boundaries=[float(2**k) for k in range(12)]), tf.int64)
        embedded = tf.nn.embedding_lookup(table, bucket, name="embed") * tf.expand_dims(normalized, 1)
    else:
        raise ValueError(f"unknown feature kind {kind!r}; one of {KINDS}")
    return tf.matmul(embedded, weight, name="contribution"), [table, weight]


def build_template(kind: str) -> Template:
    """One feature of `kind`, its gradients and its Adagrad update, built by TensorFlow in a new graph."""
    dtype = tf.float32 if kind == "dense" else tf.string
    graph = tf.Graph()
    with graph.as_default():
        column = tf.compat.v1.placeholder(dtype, [BATCH], name=TAKE_STUB)
        grad = tf.compat.v1.placeholder(tf.float32, [BATCH, 1], name=GRAD_STUB)
        with tf.compat.v1.variable_scope("feature", use_resource=True):
            contribution, variables = _feature(kind, column)
        grads = tf.gradients(contribution, variables, grad_ys=grad)
        update = tf.compat.v1.train.AdagradOptimizer(0.05).apply_gradients(list(zip(grads, variables)), name="update")
    nodes = tuple(n for n in graph.as_graph_def().node if n.name not in (TAKE_STUB, GRAD_STUB))
    return Template(kind, nodes, dtype, contribution.name, update.name)


@dataclass(frozen=True)
class Shared:
    graph_def: graph_pb2.GraphDef
    take: str  # the take op: feature f reads output f + 1 (output 0 is the label)
    d_logits: str  # the tensor every feature's gradient starts from
    contribution_stub: Callable[[int], str]
    update_stub: Callable[[int], str]


def build_shared(templates: list[Template]) -> Shared:
    """Reader, parsing, the stage, the sum of the F contributions, the loss, its gradient, train_op."""
    graph = tf.Graph()
    with graph.as_default():
        filenames = tf.compat.v1.train.string_input_producer(["train.csv"], shuffle=False, name="filenames")
        _, lines = tf.compat.v1.TextLineReader(name="reader").read_up_to(filenames, 512, name="read")
        defaults = [[0]] + [[float("nan")] if t.column_dtype == tf.float32 else [""] for t in templates]
        columns = tf.io.decode_csv(lines, defaults, name="decode_csv")
        taken = ss.staged(columns, capacity=2, name="stage")
        take = taken[0].op.name
        label = tf.reshape(tf.cast(taken[0], tf.float32), [-1, 1], name="label")
        stubs = [tf.compat.v1.placeholder(tf.float32, [BATCH, 1], name=f"contribution_stub_{i}")
                 for i in range(len(templates))]
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.compat.v1.zeros_initializer(), use_resource=True)
        logits = tf.add(tf.math.add_n(stubs, name="logit_sum"), bias, name="logits")
        loss = tf.compat.v1.losses.sigmoid_cross_entropy(label, logits)
        d_logits, d_bias = tf.gradients(loss, [logits, bias])
        bias_update = tf.compat.v1.train.AdagradOptimizer(0.05).apply_gradients([(d_bias, bias)], name="bias_update")
        updates = [tf.no_op(name=f"update_stub_{i}") for i in range(len(templates))]
        tf.group(bias_update, *updates, name="train_op")
    graph_def = graph.as_graph_def()
    return Shared(graph_def, take, d_logits.name, lambda i: f"contribution_stub_{i}", lambda i: f"update_stub_{i}")


def _renamer(prefix: str, take_output: str, d_logits: str) -> Callable[[str], str]:
    def rename(ref: str) -> str:
        control = ref.startswith("^")
        name = ref[1:] if control else ref
        node, _, port = name.partition(":")
        if node == TAKE_STUB:
            return take_output  # never a control input
        if node == GRAD_STUB:
            return d_logits
        renamed = prefix + node + (":" + port if port else "")
        return "^" + renamed if control else renamed

    return rename


def _copy(template: Template, prefix: str, take_output: str, d_logits: str, out: list) -> None:
    rename = _renamer(prefix, take_output, d_logits)
    for node in template.nodes:
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        copy.name = prefix + node.name
        if copy.input:
            copy.input[:] = [rename(ref) for ref in node.input]
        if "_class" in copy.attr:  # colocation with a variable of the same feature
            locs = copy.attr["_class"].list.s
            locs[:] = [b"loc:@" + prefix.encode() + loc[len(b"loc:@"):] for loc in locs]
        if "shared_name" in copy.attr and copy.attr["shared_name"].s:
            copy.attr["shared_name"].s = prefix.encode() + copy.attr["shared_name"].s
        out.append(copy)


def nodes_per_feature() -> dict[str, int]:
    return {t.kind: len(t.nodes) for t in _templates()}


_TEMPLATE_CACHE: dict[str, Template] = {}


def _templates() -> list[Template]:
    for kind in KINDS:
        if kind not in _TEMPLATE_CACHE:
            _TEMPLATE_CACHE[kind] = build_template(kind)
    return [_TEMPLATE_CACHE[k] for k in KINDS]


def training_graph(target_nodes: int) -> graph_pb2.GraphDef:
    """A training GraphDef of about `target_nodes` nodes (within a feature's size), deterministic.

    Features cycle through KINDS; the number of features F is chosen so the total lands on target.
    """
    kinds = _templates()
    per_cycle = sum(len(t.nodes) for t in kinds)
    shared_per_feature = 1  # its decode_csv default
    shared_base = len(build_shared(kinds[:1]).graph_def.node)
    features = max(1, math.floor((target_nodes - shared_base) / (per_cycle / len(kinds) + shared_per_feature)))
    plan = [kinds[i % len(kinds)] for i in range(features)]
    shared = build_shared(plan)
    stub_contribution = {shared.contribution_stub(i): i for i in range(features)}
    stub_update = {shared.update_stub(i): i for i in range(features)}
    prefixes = [f"f{i}/" for i in range(features)]

    nodes: list[node_def_pb2.NodeDef] = []
    feature_nodes: list[node_def_pb2.NodeDef] = []
    for i, template in enumerate(plan):
        _copy(template, prefixes[i], f"{shared.take}:{i + 1}", shared.d_logits, feature_nodes)
    for node in shared.graph_def.node:
        if node.name in stub_contribution or node.name in stub_update:
            continue  # stand-ins: the copies provide them
        if any(ref.split(":")[0].lstrip("^") in stub_contribution or ref.lstrip("^") in stub_update
               for ref in node.input):
            refs = []
            for ref in node.input:
                bare = ref.lstrip("^")
                if bare.split(":")[0] in stub_contribution:
                    i = stub_contribution[bare.split(":")[0]]
                    refs.append(prefixes[i] + plan[i].contribution)
                elif bare in stub_update:
                    i = stub_update[bare]
                    refs.append("^" + prefixes[i] + plan[i].update)
                else:
                    refs.append(ref)
            # Data inputs first, then control inputs, as a NodeDef requires.
            del node.input[:]
            node.input.extend([r for r in refs if not r.startswith("^")] + [r for r in refs if r.startswith("^")])
        nodes.append(node)
    # Topological order: the shared part up to the take, the features, then the rest of the shared part.
    # TensorFlow does not need it, but exported graphs are usually ordered this way.
    split = next(i for i, n in enumerate(nodes) if n.name == shared.take) + 1
    graph_def = graph_pb2.GraphDef()
    graph_def.versions.CopyFrom(shared.graph_def.versions)
    graph_def.node.extend(nodes[:split])
    graph_def.node.extend(feature_nodes)
    graph_def.node.extend(nodes[split:])
    return graph_def


def generator_stamp() -> str:
    """Changes when this generator's source does: cached graphs are regenerated."""
    return hashlib.sha1(Path(__file__).read_bytes()).hexdigest()[:12]


def cached_graph(out_dir: Path, target_nodes: int) -> Path:
    """The serialized graph of about `target_nodes` nodes, generated once into <out_dir>/graphs/."""
    where = out_dir / "graphs"
    path = where / f"train-{target_nodes}-{generator_stamp()}.pb"
    if not path.exists():
        where.mkdir(parents=True, exist_ok=True)
        data = training_graph(target_nodes).SerializeToString()
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(data)
        tmp.rename(path)
    return path
