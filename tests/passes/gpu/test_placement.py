"""gpu_placement: every placement rule checked in the rewritten GraphDef, on hand-drawn and TF-built graphs.

No GPU is needed to BUILD or rewrite a graph placed on one; tests/e2e/test_gpu_soft_placement.py runs them.
"""

from __future__ import annotations

import pytest
import tensorflow as tf

from smartstage.config.options import SmartStageOptions, enable_smart_stage
from smartstage.graph.view import GraphView
from smartstage.optimizer import optimize
from smartstage.graph.stages import find_stages
from smartstage.passes.gpu.placement import COPY_SCOPE, GpuPlacement
from smartstage.passes.manager import PassContext
from smartstage.passes.gpu.colocation import ColocationGroups
from smartstage.passes.gpu.devices import (
    CPU,
    GPU,
    device_type,
    merge_compatible,
    parse_device,
    same_device,
    task_spec,
)
from smartstage.passes.gpu.kernels import DEVICE, HOST, has_kernel
from smartstage.passes.gpu.prefetch_sides import prefetch_sides
from tests.builder import G, N, node

GPU0 = "/device:GPU:0"
CPU0 = "/device:CPU:0"
W1_GPU = "/job:worker/replica:0/task:1/device:GPU:0"
W1_CPU = "/job:worker/replica:0/task:1/device:CPU:0"
W0_GPU = "/job:worker/replica:0/task:0/device:GPU:0"
W0_CPU = "/job:worker/replica:0/task:0/device:CPU:0"
# The placement of a stage kept with its lanes; tests/passes/test_fold_dataset.py covers a folded stage on a GPU.
GPU_ON = enable_smart_stage(do_smart_stage_gpu=True, tf_data_stage="lanes")


def stage_ops(name="stage", dtypes=(tf.string,), inputs=("rows",), device="", queue="FIFOQueueV2"):
    enqueue, dequeue = ("QueueEnqueueV2", "QueueDequeueV2") if queue == "FIFOQueueV2" else ("QueueEnqueue",
                                                                                             "QueueDequeue")
    dtypes = list(dtypes)
    return [
        N(f"{name}/buffer", queue, component_types=dtypes, shapes=[], capacity=2, shared_name=name, device=device),
        N(f"{name}/put", enqueue, [f"{name}/buffer", *inputs], Tcomponents=dtypes, device=device),
        N(f"{name}/take", dequeue, [f"{name}/buffer"], component_types=dtypes, device=device),
        N(f"{name}/close", "QueueCloseV2" if queue == "FIFOQueueV2" else "QueueClose", [f"{name}/buffer"],
          device=device),
    ]


def model_graph(main=GPU0, prefetch=GPU0, stage_device="", rows_device=None):
    #   rows -> put ~~ take -> hash -----------------------------> lookup(w/read, hash) -> flat -> mix -> total -> loss
    #                     \-> dense -> scaled(two) ---------------------------------------------/       /
    #                              \-> shape (of dense, which does not cross) -------/  two -----/------/
    #   Before the rewrite everything after the take is on `main`; hash, dense, scaled and shape move to the
    #   prefetch side, "two" is read by both sides, lookup/flat/mix/total/loss stay.
    f, i32, i64, s = tf.float32, tf.int32, tf.int64, tf.string
    return G(
        N("rows", "Placeholder", dtype=s, device=prefetch if rows_device is None else rows_device),
        *stage_ops(device=stage_device),
        N("hash", "StringToHashBucketFast", ["stage/take"], num_buckets=10, device=main),
        N("dense", "StringToNumber", ["stage/take"], out_type=f, device=main),
        N("two", "Const", dtype=f, value=2.0, device=main),
        N("scaled", "Mul", ["dense", "two"], T=f, device=main),
        N("shape", "Shape", ["dense"], T=f, out_type=i32, device=main),
        N("w", "VariableV2", dtype=f, shape=[10, 1], device=main),
        N("w/read", "Identity", ["w"], T=f, device=main),
        N("axis", "Const", dtype=i32, value=0, device=main),
        N("lookup", "GatherV2", ["w/read", "hash", "axis"], Tparams=f, Tindices=i64, Taxis=i32, device=main),
        N("flat", "Reshape", ["lookup", "shape"], T=f, Tshape=i32, device=main),
        N("mix", "Mul", ["flat", "two"], T=f, device=main),
        N("total", "AddV2", ["mix", "scaled"], T=f, device=main),
        N("loss", "Sum", ["total", "axis"], T=f, Tidx=i32, device=main),
    )


def gpu_result(graph_def, **overrides):
    return optimize(graph_def, GPU_ON, targets=["loss"], **overrides)


def placement_of(result, stage="stage"):
    return result.extra["gpu_placement"][stage]


def slot(result, tensor):
    return result.partitions[0].boundary_after.index(tensor)


def report(result, name="gpu_placement"):
    return next(r for r in result.reports if r.name == name)


# -- the rules, checked on any rewritten graph ------------------------------------------------------------
def check_placement_rules(result) -> None:
    """Every rule of the GPU placement, on the rewritten graph of `result` (and its input)."""
    before = GraphView(result.original_graph_def)
    after = GraphView(result.graph_def)
    stages, _ = find_stages(after)
    sides = prefetch_sides(after, stages)
    placements = result.extra["gpu_placement"]
    kept = {k.node for p in placements.values() for k in p.kept}
    copies = {c for p in placements.values() for _, c in p.copies}
    stage_op_names = set(sides.stage_ops)
    for name in after.names():
        new = after.node(name).device
        if name in copies:
            assert device_type(new) == CPU, f"copy {name} must be on a CPU, is on {new!r}"
            continue
        if name not in before:  # added by the fold (the stage's new iterator read, the map, the prefetch)
            assert device_type(new) != GPU, f"{name}, added by the fold, is on {new!r}"
            continue
        old = before.node(name).device
        # Rule: the prefetch side is on a CPU (unless the report says why not).
        if name in sides.owners and name not in sides.shared and name not in kept:
            assert device_type(new) == CPU, f"prefetch-side node {name} is on {new!r}"
        if same_device(old, new) and old == new:
            continue
        # Rule: never another task's CPU.
        if device_type(new) == CPU:
            assert merge_compatible(task_spec(old), task_spec(new)) is not None, (
                f"{name} moved from {old!r} to another task: {new!r}")
        # Rule: only the stage's own ops go to a GPU, and only ops with a GPU kernel.
        if device_type(new) == GPU:
            assert name in stage_op_names or after.op(name).startswith("Queue"), (
                f"{name} was asked onto a GPU ({new!r}) but is not an op of a buffer")
            assert has_kernel(after.node(name), GPU), f"{name} ({after.op(name)}) has no GPU kernel"
        # Rule: a main-side node keeps its device, unless its group cannot run on a GPU anyway.
        if name not in sides.owners and name not in stage_op_names:
            group = ColocationGroups(after).group(name)
            assert any(has_kernel(after.node(m), GPU) is False for m in group), (
                f"main-side node {name} moved from {old!r} to {new!r}")
    # Rule: no colocation group the pass touched is split across devices.
    groups = ColocationGroups(after)
    touched = [n for n in after.names() if n not in before or after.node(n).device != before.node(n).device]
    for name in touched:
        devices = {parse_device(after.node(m).device) for m in groups.group(name) if after.node(m).device}
        assert len(devices) <= 1, f"colocation group of {name} spans {devices}"
    # Rule: a shared node keeps its device; the prefetch side reads it locally or through a copy.
    for p in placements.values():
        for original, copy in p.copies:
            assert same_device(after.node(original).device, before.node(original).device)
            assert all(f.consumer in sides.owners or f.consumer in copies or f.consumer in stage_op_names
                       for f in after.fanouts(copy))
    # Rule: the buffer's host-memory components are exactly the ones the report keeps in host memory.
    for stage in stages:
        p = placements[stage.name]
        if not any(device_type(after.node(m).device) == GPU for m in stage.ops):
            continue
        host = [j for j, b in enumerate(p.boundary) if b.memory == HOST]
        take = after.node(stage.take)
        assert list(take.attr["_output_hostmem"].list.i) == host
        put = after.node(stage.put)
        assert list(put.attr["_input_hostmem"].list.i) == [j + 1 for j in host]


# -- single machine ---------------------------------------------------------------------------------------
def test_single_machine_prefetch_side_goes_to_the_cpu_and_the_buffer_to_the_gpu():
    result = gpu_result(model_graph())
    check_placement_rules(result)
    g = result.graph_def
    for name in ("rows", "hash", "dense", "scaled", "shape"):
        assert node(g, name).device == CPU0, name
    for name in ("stage/buffer", "stage/put", "stage/take", "stage/close"):
        assert node(g, name).device == GPU0, name
    for name in ("lookup", "flat", "mix", "total", "loss", "w", "w/read"):
        assert node(g, name).device == GPU0, name
    p = placement_of(result)
    assert p.main_device == GPU0 and p.buffer_device_after == GPU0
    changes = {c.node: (c.before, c.after) for c in p.device_changes}
    assert changes["hash"] == (GPU0, CPU0)
    assert changes["stage/take"] == ("", GPU0)
    assert report(result).changed


def test_memory_of_each_boundary_tensor_follows_its_readers():
    result = gpu_result(model_graph())
    p = placement_of(result)
    by_tensor = {b.tensor: b for b in p.boundary}
    # int64 ids read by GatherV2's indices on the GPU: device memory, copied by the put.
    assert by_tensor["hash:0"].memory == DEVICE
    assert "at the put 'stage/put'" in by_tensor["hash:0"].copy_to_gpu
    # float read by AddV2 on the GPU: device memory.
    assert by_tensor["scaled:0"].memory == DEVICE
    # int32 shape read by Reshape's HostMemory shape argument: stays on the host, never copied.
    assert by_tensor["shape:0"].memory == HOST
    assert "Reshape" in by_tensor["shape:0"].reason
    assert by_tensor["shape:0"].copy_to_gpu.startswith("none")
    take = node(result.graph_def, "stage/take")
    assert list(take.attr["_output_hostmem"].list.i) == [slot(result, "shape:0")]
    put = node(result.graph_def, "stage/put")
    assert list(put.attr["_input_hostmem"].list.i) == [1 + slot(result, "shape:0")]


def test_a_constant_both_sides_read_keeps_its_device_and_the_prefetch_side_gets_a_cpu_copy():
    result = gpu_result(model_graph())
    g = result.graph_def
    copy = f"stage/{COPY_SCOPE}/two"
    assert node(g, "two").device == GPU0
    assert node(g, copy).device == CPU0 and node(g, copy).op == "Const"
    assert list(node(g, "scaled").input) == ["dense", copy]
    assert list(node(g, "mix").input) == ["flat", "two"]
    assert placement_of(result).copies == (("two", copy),)


def test_a_stateful_node_both_sides_use_is_left_where_it_is_and_reported():
    #   rows -> put ~~ take -> hash -> lookup ...;   rows -> peek (main side reads the placeholder too)
    g = model_graph()
    g.node.extend([N("peek", "Identity", ["rows"], T=tf.string, device=GPU0),
                   N("peek_len", "StringLength", ["peek"], device=GPU0)])
    result = optimize(g, GPU_ON, targets=["loss", "peek_len"])
    check_placement_rules(result)
    assert node(result.graph_def, "rows").device == GPU0
    kept = {k.node: k.reason for k in placement_of(result).kept}
    assert "the main side uses it too" in kept["rows"] and "fed" in kept["rows"]


def test_graph_without_devices_gets_plain_cpu_and_no_buffer_move_without_a_known_gpu():
    result = gpu_result(model_graph(main="", prefetch=""))
    check_placement_rules(result)
    g = result.graph_def
    assert node(g, "hash").device == CPU0 and node(g, "rows").device == CPU0
    assert node(g, "stage/take").device == ""
    p = placement_of(result)
    assert p.main_device is None
    assert "names no GPU" in p.notes[0]


def test_main_device_option_places_the_buffer_for_an_unplaced_model():
    from smartstage.passes.expand_stage import ExpandStage
    from smartstage.passes.find_stages import FindStages
    from smartstage.passes.partition import Partition
    from smartstage.passes.manager import PassManager

    ctx = PassContext(options=SmartStageOptions(do_smart_stage=True, do_smart_stage_gpu=True), targets={"loss"})
    graph_def, _ = PassManager([FindStages(), Partition(), ExpandStage(), GpuPlacement(main_device="/gpu:0")]).run(
        model_graph(main="", prefetch=""), ctx)
    assert node(graph_def, "stage/take").device == GPU0
    assert ctx.gpu_placement["stage"].main_device == GPU0


def test_nothing_to_place_reports_no_change():
    #   everything on the CPU already, no GPU anywhere: the GPU pass must say it changed nothing.
    result = gpu_result(model_graph(main=CPU0, prefetch=CPU0))
    assert report(result, "expand_stage").changed
    assert not report(result).changed
    assert "nothing to place" in report(result).summary[-1]


def test_no_stage_is_no_change():
    g = G(N("x", "Const", dtype=tf.float32, value=1.0, device=GPU0))
    ctx = PassContext(options=SmartStageOptions(do_smart_stage_gpu=True))
    result = GpuPlacement().run(g, ctx)
    assert not result.changed and result.graph_def is g


def test_running_twice_gives_the_same_graph():
    once = gpu_result(model_graph())
    twice = gpu_result(once.graph_def)
    assert not report(twice).changed
    assert twice.graph_def == once.graph_def


# -- colocation, kernels, resources -------------------------------------------------------------------------
def test_a_prefetch_node_colocated_with_a_main_side_gpu_node_stays_with_its_group():
    #   rows -> put ~~ take -> norm{_class: loc:@mix} -> ...   (norm moves, but is colocated with mix, main side)
    g = model_graph()
    node(g, "scaled").attr["_class"].list.s.append(b"loc:@mix")
    result = gpu_result(g)
    check_placement_rules(result)
    assert node(result.graph_def, "scaled").device == GPU0
    kept = {k.node: k.reason for k in placement_of(result).kept}
    assert "colocated with the main-side node 'mix'" in kept["scaled"]


def test_a_lookup_table_moves_with_its_initializer_because_it_cannot_run_on_a_gpu():
    #   table(HashTableV2) -> find(LookupTableFindV2, keys=rows) -> put ~~ take -> ids -> ...
    #   table -> init(InitializeTableV2)   (init is run by the initializer, not by the prefetch side)
    s, i64 = tf.string, tf.int64
    g = G(
        N("rows", "Placeholder", dtype=s, device=GPU0),
        N("table", "HashTableV2", key_dtype=s, value_dtype=i64, shared_name="t", device=GPU0),
        N("keys", "Const", dtype=s, value=[b"a", b"b"], device=GPU0),
        N("values", "Const", dtype=i64, value=[1, 2], device=GPU0),
        N("init", "InitializeTableV2", ["table", "keys", "values"], Tkey=s, Tval=i64, device=GPU0),
        N("default", "Const", dtype=i64, value=-1, device=GPU0),
        N("find", "LookupTableFindV2", ["table", "rows", "default"], Tin=s, Tout=i64, device=GPU0),
        *stage_ops(dtypes=[i64], inputs=["find"]),
        N("ids", "Identity", ["stage/take"], T=i64, device=GPU0),
        N("w", "VariableV2", dtype=tf.float32, shape=[10, 1], device=GPU0),
        N("axis", "Const", dtype=tf.int32, value=0, device=GPU0),
        N("loss", "GatherV2", ["w", "ids", "axis"], Tparams=tf.float32, Tindices=i64, Taxis=tf.int32, device=GPU0),
    )
    result = optimize(g, GPU_ON, targets=["loss", "init"])
    check_placement_rules(result)
    out = result.graph_def
    assert {node(out, n).device for n in ("table", "find", "init")} == {CPU0}
    changes = {c.node: c.why for c in placement_of(result).device_changes}
    assert "runs on the CPU anyway" in changes["init"]


def test_a_prefetch_op_without_a_cpu_kernel_is_left_and_reported():
    #   x -> reduced (NcclAllReduce: GPU kernel only) -> put ~~ take -> y -> loss(w)
    f = tf.float32
    g = G(
        N("x", "Placeholder", dtype=f, device=GPU0),
        N("reduced", "NcclAllReduce", ["x"], T=f, reduction="sum", num_devices=1, shared_name="r", device=GPU0),
        *stage_ops(dtypes=[f], inputs=["reduced"]),
        N("y", "Square", ["stage/take"], T=f, device=GPU0),
        N("w", "VariableV2", dtype=f, shape=[], device=GPU0),
        N("loss", "Mul", ["y", "w"], T=f, device=GPU0),
    )
    result = optimize(g, GPU_ON, targets=["loss"])
    check_placement_rules(result)
    out = result.graph_def
    assert node(out, "reduced").device == GPU0
    assert node(out, "x").device == CPU0 and node(out, "y").device == CPU0
    kept = {k.node: k.reason for k in placement_of(result).kept}
    assert "has no CPU kernel" in kept["reduced"]


def test_a_v1_queue_stays_on_the_cpu_because_it_has_no_gpu_kernel():
    f = tf.float32
    g = G(
        N("x", "Placeholder", dtype=f, device=GPU0),
        *stage_ops(dtypes=[f], inputs=["x"], queue="FIFOQueue"),
        N("y", "Square", ["stage/take"], T=f, device=GPU0),
        N("w", "VariableV2", dtype=f, shape=[], device=GPU0),
        N("loss", "Mul", ["y", "w"], T=f, device=GPU0),
    )
    result = optimize(g, GPU_ON, targets=["loss"])
    check_placement_rules(result)
    assert node(result.graph_def, "stage/take").device == ""
    assert node(result.graph_def, "y").device == CPU0
    assert "has no GPU kernel" in placement_of(result).notes[0]


def test_strings_and_cpu_readers_keep_their_tensors_on_the_host():
    #   rows -> put ~~ take -> upper (main side, string op: CPU only) ; take -> num -> w
    s, f = tf.string, tf.float32
    g = G(
        N("rows", "Placeholder", dtype=s, device=GPU0),
        N("vals", "Placeholder", dtype=f, device=GPU0),
        *stage_ops(dtypes=[s, f, f], inputs=["rows", "vals", "vals"]),
        N("w", "VariableV2", dtype=s, shape=[], device=GPU0),
        N("joined", "StringJoin", ["stage/take", "w"], N=2, device=GPU0),
        N("v", "VariableV2", dtype=f, shape=[], device=GPU0),
        N("on_gpu", "Mul", ["stage/take:1", "v"], T=f, device=GPU0),
        N("v2", "VariableV2", dtype=f, shape=[], device=CPU0),
        N("on_cpu", "Mul", ["stage/take:2", "v2"], T=f, device=CPU0),
    )
    result = optimize(g, GPU_ON, targets=["joined", "on_gpu", "on_cpu"])
    check_placement_rules(result)
    memory = [b.memory for b in placement_of(result).boundary]
    assert memory == [HOST, DEVICE, HOST]
    assert "on /device:CPU:0" in placement_of(result).boundary[2].reason


def test_staging_area_buffer_moves_with_host_memory_on_its_own_indices():
    s, f = tf.string, tf.float32
    g = G(
        N("rows", "Placeholder", dtype=s, device=GPU0),
        N("vals", "Placeholder", dtype=f, device=GPU0),
        N("stage/put", "Stage", ["rows", "vals"], dtypes=[s, f], shared_name="sa", device=""),
        N("stage/take", "Unstage", [], dtypes=[s, f], shared_name="sa", device=""),
        N("w", "VariableV2", dtype=s, shape=[], device=GPU0),
        N("joined", "StringJoin", ["stage/take", "w"], N=2, device=GPU0),
        N("v", "VariableV2", dtype=f, shape=[], device=GPU0),
        N("prod", "Mul", ["stage/take:1", "v"], T=f, device=GPU0),
    )
    result = optimize(g, GPU_ON, targets=["joined", "prod"])
    out = result.graph_def
    assert node(out, "stage/put").device == GPU0 and node(out, "stage/take").device == GPU0
    assert list(node(out, "stage/put").attr["_input_hostmem"].list.i) == [0]  # no handle input: index 0
    assert list(node(out, "stage/take").attr["_output_hostmem"].list.i) == [0]


def test_two_towers_each_get_their_own_gpu_buffer_and_share_the_cpu():
    #   rows_a -> a/put ~~ a/take -> hash_a -> lookup_a(w) on GPU:0
    #   rows_b -> b/put ~~ b/take -> hash_b -> lookup_b(w) on GPU:1
    s, f, i64, i32 = tf.string, tf.float32, tf.int64, tf.int32
    gpu1 = "/device:GPU:1"
    g = G(N("w", "VariableV2", dtype=f, shape=[10, 1], device=CPU0), N("axis", "Const", dtype=i32, value=0))
    for tower, gpu in (("a", GPU0), ("b", gpu1)):
        g.node.extend([
            N(f"rows_{tower}", "Placeholder", dtype=s, device=gpu),
            *stage_ops(tower, inputs=[f"rows_{tower}"]),
            N(f"hash_{tower}", "StringToHashBucketFast", [f"{tower}/take"], num_buckets=10, device=gpu),
            N(f"lookup_{tower}", "GatherV2", ["w", f"hash_{tower}", "axis"], Tparams=f, Tindices=i64, Taxis=i32,
              device=gpu),
        ])
    result = optimize(g, GPU_ON, targets=["lookup_a", "lookup_b"])
    check_placement_rules(result)
    out = result.graph_def
    assert node(out, "a/take").device == GPU0 and node(out, "b/take").device == gpu1
    assert {node(out, n).device for n in ("rows_a", "rows_b", "hash_a", "hash_b")} == {CPU0}


# -- cluster ----------------------------------------------------------------------------------------------
def test_cluster_nodes_go_to_their_own_tasks_cpu():
    #   main side on worker 1's GPU; the stage ops on worker 1's CPU (as a CPU SmartStage left them);
    #   rows is read on worker 0 and must stay on worker 0; an unplaced prefetch node gets worker 1's CPU.
    g = model_graph(main=W1_GPU, stage_device=W1_CPU, rows_device=W0_GPU)
    node(g, "dense").device = ""
    result = gpu_result(g)
    check_placement_rules(result)
    out = result.graph_def
    assert node(out, "rows").device == W0_CPU
    assert node(out, "hash").device == W1_CPU
    assert node(out, "dense").device == W1_CPU
    assert node(out, f"stage/{COPY_SCOPE}/two").device == W1_CPU
    for name in ("stage/buffer", "stage/put", "stage/take", "stage/close"):
        assert node(out, name).device == W1_GPU, name
    assert placement_of(result).main_device == W1_GPU


def test_cluster_partial_device_strings_keep_their_own_fields():
    g = model_graph(main="/job:worker/task:2/device:GPU:0", prefetch="/job:worker/task:2/gpu:0")
    out = gpu_result(g).graph_def
    assert node(out, "hash").device == "/job:worker/task:2/device:CPU:0"
    assert node(out, "rows").device == "/job:worker/task:2/device:CPU:0"
    assert node(out, "stage/take").device == "/job:worker/task:2/device:GPU:0"


# -- TF-built graphs ----------------------------------------------------------------------------------------
def tf_model(device: str):
    from smartstage.runtime import staged

    g = tf.Graph()
    with g.as_default(), tf.device(device):
        lines = tf.constant(["1,c1,0.5", "0,c2,1.5", "1,c3,2.5", "0,c4,3.5"])
        batch = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensor_slices(lines).batch(2)).get_next()
        label, cat, dense = tf.io.decode_csv(batch, [[0], [""], [0.0]])
        f = staged({"label": label, "cat": cat, "dense": dense})
        ids = tf.strings.to_hash_bucket_fast(f["cat"], 10)
        w = tf.compat.v1.get_variable("w", [10, 1], initializer=tf.compat.v1.ones_initializer())
        emb = tf.reshape(tf.nn.embedding_lookup(w, ids), tf.shape(f["dense"]))
        loss = tf.reduce_mean(tf.square(emb * f["dense"] - tf.cast(f["label"], tf.float32)))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
        return tf.compat.v1.train.export_meta_graph(), loss.op.name


@pytest.mark.parametrize("device", [GPU0, W1_GPU, "/job:worker/task:3/device:GPU:1"])
def test_tf_built_model_holds_every_rule(device):
    meta, loss = tf_model(device)
    result = optimize(meta, GPU_ON, targets=[loss])
    check_placement_rules(result)
    p = placement_of(result)
    main = parse_device(device)
    assert parse_device(p.buffer_device_after) == main
    cpu = main.replace(device_type="CPU", device_index=0)
    out = GraphView(result.graph_def)
    for name in ("DecodeCSV", "StringToHashBucketFast", "IteratorGetNext", "OneShotIterator"):
        assert parse_device(out.node(name).device) == cpu, name
    assert any(b.memory == DEVICE for b in p.boundary)
    assert all(b.memory == HOST for b in p.boundary if b.dtype in ("string", "int32") and "Reshape" in b.reason
               or b.dtype == "string")
    # the summary names what moved and where the copies are
    text = "\n".join(report(result).summary)
    assert "placed on" in text and "copied at the put" in text


def test_report_is_data():
    result = gpu_result(model_graph())
    p = placement_of(result)
    data = p.as_dict()
    assert data["stage"] == "stage" and data["buffer_device_after"] == GPU0
    assert {"node", "before", "after", "why"} <= set(data["device_changes"][0])
    assert report(result).details == tuple(result.extra["gpu_placement"].values())


def test_queue_ops_on_the_buffer_that_the_stage_def_does_not_name_follow_the_buffer():
    meta, loss = tf_model(GPU0)
    for n in meta.graph_def.node:  # the stage ops of staged() left unplaced, as without a device scope
        if n.name.startswith("stage/"):
            n.device = ""
    meta.graph_def.node.extend([N("stage/probe", "QueueIsClosedV2", ["stage/buffer"])])
    result = optimize(meta, GPU_ON, targets=[loss])
    check_placement_rules(result)
    assert node(result.graph_def, "stage/probe").device == GPU0
    assert node(result.graph_def, "stage/buffer").device == GPU0


# -- random placements --------------------------------------------------------------------------------------
from hypothesis import HealthCheck, given, settings, strategies as st  # noqa: E402

# One machine, or one worker task, per graph: a stage whose nodes are pinned to GPUs of two different tasks
# is not supported (a colocation group spanning them is left where it is, and a second run may then place
# it; see docs/gpu.md), so the random placements stay within one task.
DEVICE_SETS = (["", GPU0, CPU0, "/gpu:1"], ["", W1_GPU, W1_CPU, "/job:worker/task:1"], ["", W0_GPU])


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(DEVICE_SETS).flatmap(lambda devices: st.lists(st.sampled_from(devices), min_size=18,
                                                                      max_size=18)),
       st.lists(st.tuples(st.integers(0, 17), st.integers(0, 17)), max_size=3))
def test_every_rule_holds_for_any_device_assignment_and_colocation(devices, links):
    g = model_graph()
    for n, device in zip(g.node, devices):
        n.device = device
    for a, b in links:  # tf.colocate_with between random nodes, stage ops and main side included
        if a != b:
            g.node[a].attr["_class"].list.s.append(b"loc:@" + g.node[b].name.encode())
    result = gpu_result(g)
    check_placement_rules(result)
    again = gpu_result(result.graph_def)
    assert not report(again).changed, report(again).summary
