"""The two sides of a step run alone (the bounds of the end-to-end benchmark).

    sides = SidesRunner(no_stage_runner, smart_split(smart_runner))
    sides.open(); sides.sample(warmup=4, steps=20)   # {"input": Sides(...), "smart": Sides(...)}
    sides.close()
"""

from __future__ import annotations

from dataclasses import dataclass

import tensorflow as tf

import smartstage as ss
from benchmarks.runners import (
    DEFAULT_SETTING,
    ConfigRunner,
    _timed_steps,
    session_config,
    stage_arguments,
)


@dataclass(frozen=True)
class Sides:
    """The two sides of a step run alone: wall seconds and process CPU seconds per step."""

    t_in: float
    t_train: float
    cpu_in: float
    cpu_train: float


class SidesRunner:
    """Runs the input side and the training side of the step alone, for splits of the step.

        split "input": the preprocessed features (input pipeline | model)
        split "smart": the tensors SmartStage's rewritten stage carries (its cut)
        input side alone:    a stage on the split tensors, its prefetch thread producing, the main
                             loop taking batches and nothing else (the cost of producing the batches,
                             staging included; fetching them into Python would add a cost no pipeline
                             pays, and a tf.group of them would not do: Grappler prunes stateless ops
                             that only control inputs need)
        training side alone: the train op of a copy of the graph whose split tensors read one fixed
                             batch from variables (no feed_dict overhead, nothing to constant-fold)

    Adds one stage per split to the no-stage configuration's graph (nothing the train op needs, so
    the no-stage sessions never run them). `open()` starts a session per side (kept open like
    OpenRun), `sample()` times a block of each, `close()` ends them.
    """

    def __init__(self, no_stage: ConfigRunner, smart_tensors: list[str]):
        if no_stage.config.name != "no_stage":
            raise ValueError("SidesRunner extends the no_stage configuration's graph")
        self.notes: list[str] = []
        self.graph, self.model = no_stage.graph, no_stage.model
        graph = self.graph
        splits = {"input": sorted({t.name for t in self.model.preprocessed.values()}), "smart": smart_tensors}
        tensors: dict[str, list[tf.Tensor]] = {}
        self.stages: dict[str, tuple[object, tf.Operation]] = {}
        for name, tensor_names in splits.items():
            try:
                tensors[name] = [graph.get_tensor_by_name(t) for t in tensor_names]
            except (KeyError, ValueError) as error:
                self.notes.append(f"split {name!r} skipped: {error}")
                continue
            if not tensors[name]:
                self.notes.append(f"split {name!r} skipped: no tensors")
                del tensors[name]
                continue
            with graph.as_default():
                # One producer thread, a fixed capacity: T_in is one batch's cost (the bounds divide it by k).
                taken = ss.staged(tensors[name], name=f"bench_input_side_{name}", num_threads=1,
                                  **stage_arguments(no_stage.workload, 4))
            stage_def = next(d for d in ss.stage_defs(graph) if d.take_node == taken[0].op.name)
            self.stages[name] = (stage_def, taken[0].op)
        model = self.model
        with tf.compat.v1.Session(graph=graph, config=session_config(DEFAULT_SETTING, no_stage.workload)) as sess:
            sess.run(model.init_op)
            values = {name: sess.run(ts) for name, ts in tensors.items()}
        graph_def = graph.as_graph_def()
        self.trains: dict[str, tuple[tf.Graph, str, str]] = {}
        for name, ts in tensors.items():
            fixed_graph = tf.Graph()
            with fixed_graph.as_default():
                fixed, holders = {}, []
                for k, (tensor, value) in enumerate(zip(ts, values[name])):
                    # A resource variable holding the batch, with the tensor's own static shape:
                    # Grappler folds constants even through PlaceholderWithDefault, and would fold
                    # Unique and SparseConcat of a constant batch away.
                    holder = tf.Variable(value, trainable=False, shape=tensor.shape, name=f"bench_fixed/{k}")
                    holders.append(holder)
                    fixed[tensor.name] = holder.read_value()
                tf.graph_util.import_graph_def(graph_def, input_map=fixed, name="")
                init = tf.group(fixed_graph.get_operation_by_name(model.init_op.name),
                                tf.compat.v1.variables_initializer(holders), name="bench_fixed/init")
            self.trains[name] = (fixed_graph, init.name, model.train_op.name)
        self._open: list = []
        self.workload = no_stage.workload

    def open(self) -> None:
        config = session_config(DEFAULT_SETTING, self.workload)
        for name, (stage_def, take) in self.stages.items():
            sess = tf.compat.v1.Session(graph=self.graph, config=config)
            sess.run(self.model.init_op)
            threads = ss.start_prefetch_threads(sess, stages=[stage_def])
            self._open.append((name, "in", sess, lambda sess=sess, take=take: sess.run(take), threads))
        for name, (graph, init, train) in self.trains.items():
            sess = tf.compat.v1.Session(graph=graph, config=config)
            sess.run(init)
            op = graph.get_operation_by_name(train)
            self._open.append((name, "train", sess, lambda sess=sess, op=op: sess.run(op), None))

    def sample(self, warmup: int, steps: int) -> dict[str, Sides]:
        times: dict[str, dict[str, tuple[float, float]]] = {}
        for name, side, sess, run, _ in self._open:
            wall, cpu = _timed_steps(sess, run, warmup, steps)
            times.setdefault(name, {})[side] = (wall / steps, cpu / steps)
        return {name: Sides(t["in"][0], t["train"][0], t["in"][1], t["train"][1])
                for name, t in times.items() if "in" in t and "train" in t}

    def close(self) -> None:
        for _, _, sess, _, threads in self._open:
            if threads is not None:
                threads.stop()
            sess.close()
        self._open = []
