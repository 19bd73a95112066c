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
    staged           smartstage.staged() right after parsing (the hand-placed stage), plain Session: lanes
    staged_fold      the same graph through ss.Session with the flag off: the stage folded into its dataset
    smart            the same staged graph through ss.Session with do_smart_stage (folded, the default)
    smart_lanes      the same with tf_data_stage="lanes": the expanded stage on the prefetch threads
    smart_prefetch   SmartStage on a pipeline that keeps its own prefetch(AUTOTUNE)
    auto_stage       the no-stage graph through ss.Session with do_smart_stage and auto-stage: the
                     optimizer inserts the stage at the iterator, expands it and folds it
    auto_stage_lanes the same with tf_data_stage="lanes"

A folded stage has no buffer and no thread of ours: staged()'s capacity and num_threads are the dataset's
prefetch and map parallelism, built into the graph, so a folded configuration runs its defaults only.

A `Setting` is one point of the grid: producer threads (the stage's num_threads), the stage's
capacity, whether prefetch runs get their own inter-op pool, and the session's inter-op pool size.
The default setting is what a user gets without tuning: staged()'s and auto-stage's defaults
(num_threads = capacity = ss.AUTOTUNE, the shared pool) and TensorFlow's default pools. SmartStage
at its defaults runs through `ss.Session(config=...)`, which rewrites the live graph and starts the
prefetch threads itself; other settings run the same rewritten graph in a plain Session with
`start_prefetch_threads(sess, stages=[a StageDef with the setting's threads and pool])`, which is
what staged(num_threads=..., use_stage_subgraph_thread_pool=...) records. The capacity is built
into the buffer queue, so each capacity of the grid is its own graph (ConfigRunner(capacity=...)).

Workload.device_ms emulates an accelerator (benchmarks/accelerator.py): the model's compute becomes a
host-idle wait of that many ms per step, the input pipeline stays as it is. Workload.gpu
runs the real model on a real GPU, with SmartStage's `do_smart_stage_gpu` (no emulation).

Workload.one_core_per_side emulates a machine where the prefetch side has its own core: every
session gets intra-op 1 and two inter-op pools of 1 thread (pool 0: the training step, pool 1:
the prefetch runs of every stage, defaults included), so each side computes on at most one thread.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field

import tensorflow as tf
from tensorflow.core.protobuf import config_pb2

import smartstage as ss
from benchmarks.accelerator import build_device_model
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
    one_core_per_side: bool = False
    device_ms: float = 0.0  # > 0: the emulated accelerator's step time (the model's compute as a host-idle wait)
    gpu: bool = False  # the real model on a real GPU, SmartStage with do_smart_stage_gpu

    @property
    def name(self) -> str:
        if self.device_ms > 0:
            return f"{self.model}/device {self.device_ms:g} ms"
        return f"{self.model}/{self.variant}" + ("/1 core per side" if self.one_core_per_side else "")


@dataclass(frozen=True, order=True)
class Setting:
    """A grid point. threads / capacity: the stage's num_threads and capacity (AUTOTUNE: the runtime
    picks); own_pool: prefetch runs on their own inter-op pool of `threads` threads; inter_op: the
    session's (main) inter-op pool, 0 = one per core."""

    threads: int = ss.AUTOTUNE
    capacity: int = ss.AUTOTUNE
    own_pool: bool = False
    inter_op: int = 0

    @property
    def label(self) -> str:
        if self.threads == ss.AUTOTUNE and self.capacity == ss.AUTOTUNE and not self.own_pool and not self.inter_op:
            return "AUTOTUNE (defaults)"
        auto = lambda v: "AUTOTUNE" if v == ss.AUTOTUNE else str(v)
        pool = f"own pool {max(self.threads, 1)}" if self.own_pool else "shared pool"
        inter = f", inter-op {self.inter_op}" if self.inter_op else ""
        return f"{auto(self.threads)} thread(s), capacity {auto(self.capacity)}, {pool}{inter}"

    @property
    def lanes(self) -> int:
        """Producer threads to drain at a block's start (AUTOTUNE: read from the tuner instead)."""
        return max(self.threads, 1)


DEFAULT_SETTING = Setting()


@dataclass(frozen=True)
class Config:
    name: str
    label: str
    stage: str  # "none" | "staged" | "smart" | "auto"
    prefetch: bool = False  # the dataset ends in prefetch(AUTOTUNE)
    preprocess_in_dataset: bool = False
    tf_data_stage: str = "lanes"  # SmartStageOptions.tf_data_stage of the session: "fold" | "lanes"
    flag_off_session: bool = False  # staged() through ss.Session with the flag off (the session folds it)

    @property
    def has_stage(self) -> bool:
        return self.stage != "none"

    @property
    def rewritten(self) -> bool:
        """A SmartStage session changes the graph when it is created (expands, folds, or both)."""
        return self.stage in ("smart", "auto") or self.flag_off_session

    @property
    def folds(self) -> bool:
        """The stage is folded into its dataset: no buffer, no prefetch threads, the defaults only."""
        return self.rewritten and self.tf_data_stage == "fold"

    def session_config(self, config: tf.compat.v1.ConfigProto, workload: Workload | None = None,
                       capacity: int = ss.AUTOTUNE) -> tf.compat.v1.ConfigProto:
        """`config` with SmartStage as this configuration's user would set it (auto-stage: the stage it
        inserts gets `capacity`, and pool 1 on one core per side; the flag off: only tf_data_stage)."""
        gpu = workload is not None and workload.gpu
        if self.flag_off_session:
            entry = config.graph_options.rewrite_options.custom_optimizers.add(name="SmartStage")
            entry.parameter_map["do_smart_stage"].b = False
            entry.parameter_map["tf_data_stage"].s = self.tf_data_stage.encode()
            return config
        if self.stage != "auto":
            return ss.enable_smart_stage(config, do_smart_stage_gpu=gpu, tf_data_stage=self.tf_data_stage)
        arguments = stage_arguments(workload, capacity) if workload is not None else {"capacity": capacity}
        return ss.enable_smart_stage(config, do_smart_stage_gpu=gpu, auto_stage=ss.AutoStageOptions(**arguments),
                                     tf_data_stage=self.tf_data_stage)


CONFIGS: tuple[Config, ...] = (
    Config("no_stage", "no stage", "none"),
    Config("staged", "stage after parsing (staged)", "staged"),
    Config("staged_fold", "staged(), flag off, folded", "staged", tf_data_stage="fold", flag_off_session=True),
    Config("tfdata_prefetch", "tf.data prefetch(AUTOTUNE)", "none", prefetch=True),
    Config("tfdata_map", "preprocessing in tf.data map + prefetch", "none", prefetch=True, preprocess_in_dataset=True),
    Config("smart", "SmartStage", "smart", tf_data_stage="fold"),
    Config("smart_lanes", "SmartStage on lanes", "smart"),
    Config("smart_prefetch", "SmartStage + tf.data prefetch", "smart", prefetch=True, tf_data_stage="fold"),
    Config("auto_stage", "SmartStage auto-stage (no staged())", "auto", tf_data_stage="fold"),
    Config("auto_stage_lanes", "SmartStage auto-stage on lanes", "auto"),
)
CONFIGS_BY_NAME = {c.name: c for c in CONFIGS}
ALTERNATIVES = ("no_stage", "staged", "tfdata_prefetch", "tfdata_map")
SMART = ("smart", "smart_lanes", "smart_prefetch", "auto_stage", "auto_stage_lanes")
# Side by side in one interleaved run: (folded, on lanes) of the same graph and flag.
FOLD_PAIRS = (("staged_fold", "staged"), ("smart", "smart_lanes"), ("auto_stage", "auto_stage_lanes"))


def grid_for(config: Config, threads: tuple[int, ...] = (1, 2, 4), inter_ops: tuple[int, ...] = (0, 4),
             capacities: tuple[int, ...] = (4, 40), pools: tuple[bool, ...] = (False, True)) -> list[Setting]:
    """The grid of a configuration, default (AUTOTUNE) first.

    Stages: producer threads x capacity x (the shared inter-op pool, or an own pool for the prefetch
    runs of as many threads). Configurations without a stage: the session's inter-op pool sizes.
    """
    if not config.has_stage:
        return sorted({Setting(inter_op=i) for i in inter_ops}, key=lambda s: (s != DEFAULT_SETTING, s))
    if config.folds:  # the dataset's map and prefetch are built from staged()'s arguments: no runtime setting
        return [DEFAULT_SETTING]
    points = [Setting(threads=k, capacity=c, own_pool=own) for k in threads for c in capacities for own in pools]
    return [DEFAULT_SETTING] + sorted(set(points) - {DEFAULT_SETTING})


def session_config(setting: Setting, workload: Workload | None = None) -> tf.compat.v1.ConfigProto:
    """The session's ConfigProto. A session without its own pools runs on the process-wide inter-op pool,
    sized by the FIRST session of the process: an inter-op size takes effect only with per-session threads.
    One core per side: intra-op 1, pool 0 (training) and pool 1 (prefetch) of one thread each."""
    if workload is not None and workload.one_core_per_side:
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=1)
        config.session_inter_op_thread_pool.extend([config_pb2.ThreadPoolOptionProto(num_threads=1),
                                                    config_pb2.ThreadPoolOptionProto(num_threads=1)])
        return config
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=setting.inter_op)
    if workload is not None and workload.gpu:
        config.allow_soft_placement = True  # ops without a GPU kernel (string parsing, hashing) on the CPU
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
    drained: int = 0  # untimed steps before the block (warm-up + producer threads + the buffer's head start)
    lost: int = 0  # batches the buffer lost over the timed steps (not counted as produced)
    decisions: tuple = ()  # (lanes, capacity, settled) per stage after the block


def _model_options(workload: Workload):
    if workload.model == "dlrm":
        return DLRMOptions.benchmark() if workload.size == "benchmark" else DLRMOptions()
    if workload.model == "wide_deep":
        return WideDeepOptions.benchmark() if workload.size == "benchmark" else WideDeepOptions()
    raise ValueError(f"unknown model {workload.model!r}; use 'dlrm' or 'wide_deep'")


def stage_arguments(workload: Workload, capacity: int) -> dict:
    """staged()'s (and auto-stage's) arguments: the capacity of the grid point's graph; one core per
    side puts the prefetch runs on pool 1 (its own core), defaults included."""
    arguments: dict = {"capacity": capacity}
    if workload.one_core_per_side:
        arguments.update(use_stage_subgraph_thread_pool=True, stage_subgraph_thread_pool_id=STAGE_POOL_ID)
    return arguments


def build_model(workload: Workload, files: CriteoFiles, config: Config,
                capacity: int = ss.AUTOTUNE) -> tuple[tf.Graph, ModelGraph]:
    """The workload's training graph for `config` with a stage of `capacity`, in a new tf.Graph."""
    input_options = InputOptions(
        reader="dataset",
        batch_size=workload.batch_size,
        prefetch=-1 if config.prefetch else None,
        read_latency_ms=workload.read_latency_ms,
        preprocess_in_dataset=config.preprocess_in_dataset,
        iterator="initializable" if config.preprocess_in_dataset else "one_shot",
    )
    stage_fn = (functools.partial(ss.staged, **stage_arguments(workload, capacity))
                if config.stage in ("staged", "smart") else no_stage)
    builder = build_dlrm if workload.model == "dlrm" else build_wide_deep
    if workload.device_ms > 0:  # the same input pipeline; the model's compute a host-idle wait
        builder = functools.partial(build_device_model, model=workload.model, device_ms=workload.device_ms)
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
        run.settle(max_steps=600)           # AUTOTUNE: train until the tuner settled (steps, seconds)
        run.sample(warmup=8, steps=30)      # a block of timed steps; call again in every repeat
        run.close()

    Between blocks the session idles: its prefetch threads fill the stage buffer (up to its capacity,
    64 batches when tuned) and tf.data its prefetch buffer, then block. That head start would be
    counted as speed: a block first drains the buffered batches (warm-up + what the buffer held), and
    its rate is net of what the buffer lost during the timed steps (steps - (size before - size after)),
    i.e. what the pipeline produced, the steady-state rate when the input is the bottleneck.
    """

    def __init__(self, runner: ConfigRunner, setting: Setting):
        self.runner, self.setting = runner, setting
        model = runner.model
        config = session_config(setting, runner.workload)
        self.threads = None
        if setting == DEFAULT_SETTING and runner.config.rewritten:
            # The user's path: ss.Session starts the prefetch threads itself on the first step.
            self.sess = ss.Session(graph=runner.graph, config=runner.config.session_config(
                config, runner.workload, runner.capacity))
            self.sess.run(model.init_op)
        else:
            self.sess = tf.compat.v1.Session(graph=runner.graph, config=config)
            self.sess.run(model.init_op)
            if runner.config.has_stage:
                self.threads = ss.start_prefetch_threads(self.sess, stages=runner.stage_defs_for(setting))
        self.train = lambda: self.sess.run(model.train_op)  # what a training loop does, in every configuration

    def prefetch_threads(self):
        return self.threads if self.threads is not None else getattr(self.sess, "prefetch_threads", None)

    def decisions(self) -> list:
        threads = self.prefetch_threads()
        return list(threads.decisions()) if threads is not None else []

    def buffered(self) -> int:
        """Batches waiting in the stage buffers and in their lanes' queues (lanes exist once threads run)."""
        if not self.runner.config.has_stage:
            return 0
        names = [d.size_node for d in self.runner.stage_defs if d.size_node]
        names += [op.name for op in self.runner.graph.get_operations() if op.type == "QueueSizeV2"
                  and "/lanes/lane_" in op.name and op.name.endswith("/size")]
        return int(sum(self.sess.run([name + ":0" for name in names]))) if names else 0

    def settle(self, max_steps: int, max_seconds: float) -> dict:
        """Trains until every tuned stage settled; what it took and what the tuner chose (a folded stage:
        nothing to settle, tf.data tunes its map and prefetch as it runs)."""
        not_folded = self.runner.not_folded
        if self.runner.config.folds and not not_folded:
            return {"steps": 0, "seconds": 0.0, "settled": True, "decisions": [], "folded": True}
        start, steps = time.perf_counter(), 0
        while steps < max_steps and time.perf_counter() - start < max_seconds:
            self.train()
            steps += 1
            decisions = self.decisions()
            if decisions and all(d.settled for d in decisions) and steps >= 2:
                break
        decisions = self.decisions()
        return {"steps": steps, "seconds": round(time.perf_counter() - start, 2),
                "settled": bool(decisions) and all(d.settled for d in decisions),
                "decisions": [(d.num_threads, d.capacity, d.reason) for d in decisions],
                "not_folded": list(not_folded)}

    def sample(self, warmup: int, steps: int) -> Sample:
        global_step = self.runner.model.global_step
        first = self.sess.run(global_step)
        # + one batch per lane: a head may hold a ticket's values while its lane's queue is full.
        lanes = max([d.num_threads for d in self.decisions()] + [self.setting.lanes]) * 2
        drain = warmup + lanes + self.buffered()
        for _ in range(drain):
            self.train()
        before = self.buffered()
        wall, cpu = _timed_steps(self.sess, self.train, 0, steps)
        lost = max(0, before - self.buffered())
        advanced = int(self.sess.run(global_step) - first)
        return Sample((steps - lost) / wall, 1000.0 * cpu / steps, steps, advanced, wall, drain, lost,
                      tuple((d.num_threads, d.capacity, d.settled) for d in self.decisions()))

    def close(self) -> None:
        if self.threads is not None:
            self.threads.stop()
        self.sess.close()


@dataclass
class ConfigRunner:
    """A configuration's graph with a stage of `capacity`, built once for a workload; `open` starts a
    session at a setting."""

    config: Config
    workload: Workload
    files: CriteoFiles
    capacity: int = ss.AUTOTUNE
    graph: tf.Graph = field(init=False)
    model: ModelGraph = field(init=False)
    build_seconds: float = field(init=False)
    rewrite: ss.LiveRewrite | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        start = time.perf_counter()
        self.graph, self.model = build_model(self.workload, self.files, self.config, self.capacity)
        self.build_seconds = time.perf_counter() - start
        if self.config.rewritten:
            # The user's path: creating the session rewrites the live graph (once per graph).
            config = self.config.session_config(session_config(DEFAULT_SETTING, self.workload), self.workload,
                                                self.capacity)
            sess = ss.Session(graph=self.graph, config=config)
            self.rewrite = sess.smart_stage
            sess.close()

    @property
    def not_folded(self) -> tuple[str, ...]:
        """Why stages of a folding configuration kept their buffer and lanes (fold_dataset's reasons); () when
        every stage folded or the configuration does not fold. Such a stage is tuned and timed as lanes."""
        if not self.config.folds:
            return ()
        result = self.rewrite.result if self.rewrite is not None else None
        report = next((r for r in result.reports if r.name == "fold_dataset"), None) if result is not None else None
        if report is None:
            return ("the session ran no fold_dataset pass",)
        return tuple(f"{name}: {fit.skipped}" for name, fit in (report.details or {}).items() if fit.skipped)

    @property
    def stage_defs(self) -> list:
        return list(ss.stage_defs(self.graph))

    @property
    def stage_def(self):
        defs = self.stage_defs
        return defs[0] if defs else None

    def stage_defs_for(self, setting: Setting) -> list:
        """The graph's StageDefs with the setting's producer threads and pool (what staged() records);
        the capacity is the graph's own (built into the queue)."""
        out = []
        for graph_def in self.stage_defs:
            stage_def = type(graph_def)()
            stage_def.CopyFrom(graph_def)  # the graph's own StageDef stays as staged() wrote it
            if setting != DEFAULT_SETTING:
                stage_def.num_threads = setting.threads
                if not self.workload.one_core_per_side:
                    stage_def.use_stage_subgraph_thread_pool = setting.own_pool
                    stage_def.stage_subgraph_thread_pool_id = STAGE_POOL_ID if setting.own_pool else 0
            out.append(stage_def)
        return out

    def open(self, setting: Setting) -> OpenRun:
        return OpenRun(self, setting)


def smart_split(runner: ConfigRunner) -> list[str]:
    """SmartStage's cut: the tensors its rewritten stage carries (prefetch-side names)."""
    if runner.rewrite is None or not runner.rewrite.stages:
        return []
    return sorted({name for stage in runner.rewrite.stages for name in stage.boundary})
