"""The configurations of the end-to-end benchmark: one graph each, one open session per grid point.

    runner = ConfigRunner(CONFIGS_BY_NAME["smart"], workload, files)     # builds the graph once
    run = runner.open(Setting(threads=2, own_pool=True))                # session, init, prefetch threads
    sample = run.sample(warmup=5, steps=40)                             # one timed block; again per repeat
    sample.steps_per_sec, sample.cpu_ms_per_step
    run.close()

Every configuration trains the same model on the same CSV through a real input pipeline
(TextLineDataset -> batch -> [storage latency] -> iterator -> decode_csv -> preprocessing):

    no_stage         the plain graph
    tfdata_prefetch  ... -> prefetch(AUTOTUNE) -> iterator, no stage
    tfdata_map       parsing and preprocessing in the Dataset.map, then prefetch(AUTOTUNE)
    staged           smartstage.staged() right after parsing (the hand-placed stage), plain Session
    smart            the same staged graph through ss.Session with do_smart_stage
    smart_prefetch   SmartStage on a pipeline that keeps its own prefetch(AUTOTUNE)
    auto_stage       the no-stage graph through ss.Session with do_smart_stage and auto-stage: the
                     optimizer inserts the stage at the iterator and expands it

A `Setting` is one point of the grid: producer threads (the stage's num_threads), whether prefetch
runs get their own inter-op pool, and the session's inter-op pool size. The default setting is what
a user gets without tuning: staged()'s defaults (1 thread, capacity 1, the shared pool) and
TensorFlow's default pools. SmartStage at its defaults runs through `ss.Session(config=...)`, which
rewrites the live graph and starts the prefetch threads itself; other settings run the same
rewritten graph in a plain Session with `start_prefetch_threads(sess, stages=[a StageDef with the
setting's threads and pool])`, which is what staged(num_threads=..., use_stage_subgraph_thread_pool=...)
records.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Optional

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage as ss
from smartstage.examples import (
    CriteoFiles,
    DLRMOptions,
    InputOptions,
    ModelGraph,
    WideDeepOptions,
    build_dlrm,
    build_wide_deep,
    no_stage,
)

STAGE_POOL_ID = 1  # pool 0 runs the training step once session_inter_op_thread_pool is set


@dataclass(frozen=True)
class Workload:
    """One model on one input: `size` "benchmark" (the examples' benchmark sizes) or "small" (tests)."""

    model: str  # "dlrm" | "wide_deep"
    variant: str  # "cpu" | "io"
    read_latency_ms: float = 0.0
    batch_size: int = 512
    size: str = "benchmark"

    @property
    def name(self) -> str:
        return f"{self.model}/{self.variant}"


@dataclass(frozen=True, order=True)
class Setting:
    """A grid point. threads: producer threads of the stage; own_pool: prefetch runs on their own
    inter-op pool of `threads` threads; inter_op: the session's (main) inter-op pool, 0 = one per core."""

    threads: int = 1
    own_pool: bool = False
    inter_op: int = 0

    @property
    def label(self) -> str:
        pool = f"own pool {self.threads}" if self.own_pool else "shared pool"
        inter = f"inter-op {self.inter_op}" if self.inter_op else "inter-op default"
        return f"{self.threads} thread(s), {pool}, {inter}"


DEFAULT_SETTING = Setting()


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    stage: str  # "none" | "staged" | "smart" | "auto"
    prefetch: bool = False  # the dataset ends in prefetch(AUTOTUNE)
    preprocess_in_dataset: bool = False

    @property
    def has_stage(self) -> bool:
        return self.stage != "none"

    @property
    def rewritten(self) -> bool:
        """SmartStage rewrites the graph when the session is created."""
        return self.stage in ("smart", "auto")

    def session_config(self, config: tf.compat.v1.ConfigProto) -> tf.compat.v1.ConfigProto:
        """`config` with SmartStage turned on as this configuration's user would."""
        return ss.enable_smart_stage(config, auto_stage=self.stage == "auto")


CONFIGS: tuple[Config, ...] = (
    Config("no_stage", "no stage", "none"),
    Config("staged", "stage after parsing (staged)", "staged"),
    Config("tfdata_prefetch", "tf.data prefetch(AUTOTUNE)", "none", prefetch=True),
    Config("tfdata_map", "preprocessing in tf.data map + prefetch", "none", prefetch=True, preprocess_in_dataset=True),
    Config("smart", "SmartStage", "smart"),
    Config("smart_prefetch", "SmartStage + tf.data prefetch", "smart", prefetch=True),
    Config("auto_stage", "SmartStage auto-stage (no staged())", "auto"),
)
CONFIGS_BY_NAME = {c.name: c for c in CONFIGS}
ALTERNATIVES = ("no_stage", "staged", "tfdata_prefetch", "tfdata_map")
SMART = ("smart", "smart_prefetch", "auto_stage")


def grid_for(config: Config, threads: tuple[int, ...] = (1, 2, 4), inter_ops: tuple[int, ...] = (0, 4)) -> list[Setting]:
    """The grid of a configuration, default first.

    Stages: producer threads x (the shared inter-op pool, or an own pool for the prefetch runs of as
    many threads). Configurations without a stage: the session's inter-op pool sizes. (A larger
    shared pool for stage configurations was measured too, see docs/performance.md; it is left out
    of the grid to keep the full run under 10 minutes.)
    """
    if not config.has_stage:
        return [Setting(inter_op=i) for i in inter_ops]
    points = [Setting(threads=k, own_pool=own) for k in threads for own in (False, True)]
    return sorted(set(points), key=lambda s: (s != DEFAULT_SETTING, s))


def session_config(setting: Setting) -> tf.compat.v1.ConfigProto:
    """The session's ConfigProto. A session without its own pools runs on the process-wide inter-op pool,
    sized by the FIRST session of the process: an inter-op size takes effect only with per-session threads."""
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=setting.inter_op)
    if setting.inter_op and not setting.own_pool:
        config.use_per_session_threads = True
    if setting.own_pool:
        config.session_inter_op_thread_pool.extend([
            config_pb2.ThreadPoolOptionProto(num_threads=setting.inter_op),
            config_pb2.ThreadPoolOptionProto(num_threads=setting.threads),
        ])
    return config


@dataclass(frozen=True)
class Sample:
    """One timed run: `steps` training steps after the warm-up, in one session."""

    steps_per_sec: float
    cpu_ms_per_step: float  # process CPU time (every thread) per step
    steps: int
    global_steps: int  # how far global_step advanced over warm-up and timed steps (a sanity check)
    seconds: float


def _model_options(workload: Workload):
    if workload.model == "dlrm":
        return DLRMOptions.benchmark() if workload.size == "benchmark" else DLRMOptions()
    if workload.model == "wide_deep":
        return WideDeepOptions.benchmark() if workload.size == "benchmark" else WideDeepOptions()
    raise ValueError(f"unknown model {workload.model!r}; use 'dlrm' or 'wide_deep'")


def build_model(workload: Workload, files: CriteoFiles, config: Config) -> tuple[tf.Graph, ModelGraph]:
    """The workload's training graph for `config`, in a new tf.Graph."""
    input_options = InputOptions(
        reader="dataset",
        batch_size=workload.batch_size,
        prefetch=-1 if config.prefetch else None,
        read_latency_ms=workload.read_latency_ms,
        preprocess_in_dataset=config.preprocess_in_dataset,
        iterator="initializable" if config.preprocess_in_dataset else "one_shot",
    )
    stage_fn = ss.staged if config.stage in ("staged", "smart") else no_stage
    builder = build_dlrm if workload.model == "dlrm" else build_wide_deep
    graph = tf.Graph()
    with graph.as_default():
        model = builder(files.data_path, files.vocabulary_paths, stage_fn=stage_fn,
                        options=_model_options(workload), input_options=input_options)
    return graph, model


def _timed_steps(sess, fetch, warmup: int, steps: int) -> tuple[float, float]:
    """Wall and process CPU seconds of `steps` runs of `fetch` (or calls of a callable) after `warmup`."""
    run = fetch if callable(fetch) else (lambda: sess.run(fetch))
    for _ in range(warmup):
        run()
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(steps):
        run()
    return time.perf_counter() - wall, time.process_time() - cpu


class OpenRun:
    """A session of one configuration at one setting, kept open so it can be timed again and again.

        run = runner.open(setting)          # session, initialisation, prefetch threads
        run.sample(warmup=8, steps=30)      # a block of timed steps; call again in every repeat
        run.close()

    Between blocks the session idles: its prefetch threads and tf.data prefetching fill their
    buffers and block, costing no CPU. A block's warm-up steps drain that head start before the
    clock starts, so interleaving open sessions measures each in its steady state.
    """

    def __init__(self, runner: "ConfigRunner", setting: Setting):
        self.runner, self.setting = runner, setting
        model = runner.model
        config = session_config(setting)
        self.threads = None
        if runner.config.rewritten and setting == DEFAULT_SETTING:
            # The user's path: ss.Session starts the prefetch threads itself on the first step.
            self.sess = ss.Session(graph=runner.graph, config=runner.config.session_config(config))
            self.sess.run(model.init_op)
        else:
            self.sess = tf.compat.v1.Session(graph=runner.graph, config=config)
            self.sess.run(model.init_op)
            if runner.config.has_stage:
                self.threads = ss.start_prefetch_threads(self.sess, stages=[runner.stage_def_for(setting)])
        self.train = lambda: self.sess.run(model.train_op)  # what a training loop does, in every configuration

    def sample(self, warmup: int, steps: int) -> Sample:
        global_step = self.runner.model.global_step
        first = self.sess.run(global_step)
        wall, cpu = _timed_steps(self.sess, self.train, warmup, steps)
        advanced = int(self.sess.run(global_step) - first)
        return Sample(steps / wall, 1000.0 * cpu / steps, steps, advanced, wall)

    def close(self) -> None:
        if self.threads is not None:
            self.threads.stop()
        self.sess.close()


@dataclass
class ConfigRunner:
    """A configuration's graph, built once for a workload; `open` starts a session at a setting."""

    config: Config
    workload: Workload
    files: CriteoFiles
    graph: tf.Graph = field(init=False)
    model: ModelGraph = field(init=False)
    build_seconds: float = field(init=False)
    rewrite: Optional[ss.LiveRewrite] = field(init=False, default=None)

    def __post_init__(self) -> None:
        start = time.perf_counter()
        self.graph, self.model = build_model(self.workload, self.files, self.config)
        self.build_seconds = time.perf_counter() - start
        if self.config.rewritten:
            # The user's path: creating the session rewrites the live graph (once per graph).
            sess = ss.Session(graph=self.graph, config=self.config.session_config(session_config(DEFAULT_SETTING)))
            self.rewrite = sess.smart_stage
            sess.close()

    @property
    def stage_def(self):
        defs = ss.stage_defs(self.graph)
        return defs[0] if defs else None

    def stage_def_for(self, setting: Setting):
        """The graph's StageDef with the setting's producer threads and pool (what staged() records)."""
        stage_def = type(self.stage_def)()
        stage_def.CopyFrom(self.stage_def)  # the graph's own StageDef stays as staged() wrote it
        stage_def.num_threads = setting.threads
        stage_def.use_stage_subgraph_thread_pool = setting.own_pool
        stage_def.stage_subgraph_thread_pool_id = STAGE_POOL_ID if setting.own_pool else 0
        return stage_def

    def open(self, setting: Setting) -> OpenRun:
        return OpenRun(self, setting)


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
                taken = ss.staged(tensors[name], name=f"bench_input_side_{name}")
            stage_def = next(d for d in ss.stage_defs(graph) if d.take_node == taken[0].op.name)
            self.stages[name] = (stage_def, taken[0].op)
        model = self.model
        with tf.compat.v1.Session(graph=graph, config=session_config(DEFAULT_SETTING)) as sess:
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

    def open(self) -> None:
        config = session_config(DEFAULT_SETTING)
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


def smart_split(runner: ConfigRunner) -> list[str]:
    """SmartStage's cut: the tensors its rewritten stage carries (prefetch-side names)."""
    if runner.rewrite is None or not runner.rewrite.stages:
        return []
    return sorted({name for stage in runner.rewrite.stages for name in stage.boundary})
