"""The names of the ops SmartStage adds beside a stage, spelled once for the code that writes them and the code
that finds them again: the input-tasks marker (written by passes/input_tasks.py, read by runtime/lanes/remote.py
and inspection/placement.py) and the lanes (built and found by runtime/lanes/, skipped by session/live_rewrite.py).

    before:  f"{stage}/input_tasks", f"{scope}/lane_{i}/enqueue" spelled in the pass, the runtime and inspection
    after:   input_tasks_marker(stage), LaneNames.of(scope, i).enqueue

Strings only (no TensorFlow): the graph layer is the lowest one both the passes and the runtime read.
"""

from __future__ import annotations

from dataclasses import dataclass

# The input-tasks pass's plan: the NoOp `<stage>/input_tasks`, whose attributes hold it, and task i's copies.
INPUT_TASKS_MARKER = "input_tasks"
INPUT_TASK_SCOPE = "input_task_{}"  # <stage>/input_task_<i>/<node>: task i's copy of a node
ATTR_TASKS = "_smartstage_input_tasks"
ATTR_MODE = "_smartstage_input_mode"
ATTR_CUT = "_smartstage_input_cut"
ATTR_TIMEOUT = "_smartstage_input_timeout_millis"
# input_num_threads_per_task; the attribute keeps the name optimized graphs already carry
ATTR_THREADS_PER_TASK = "_smartstage_input_lanes_per_task"

# The lanes of a stage: `<stage>/lanes/` on the trainer, `<stage>/remote_lanes/` for a stage on input tasks.
LANES_SCOPE = "lanes"
REMOTE_LANES_SCOPE = "remote_lanes"
LANE_SCOPES = (LANES_SCOPE, REMOTE_LANES_SCOPE)
HEAD_TARGETS = "head_targets"         # <scope>/head_targets: the put's control inputs the head runs
PUT_OCCUPANCY = "put_occupancy"       # <scope>/put_occupancy: the buffer's size right after the put
BATCH_BYTES = "batch_bytes"           # <scope>/batch_bytes: a batch's bytes

# A stage folded into its iterator's dataset (passes/fold_dataset.py): `<stage>/dataset_fold/IteratorGetNext` is
# the read the step takes its batch from (`dataset_fold_<k>/` for the k-th dataset of the same iterator).
DATASET_FOLD_SCOPE = "dataset_fold"
FOLDED_READ = "IteratorGetNext"

# The ops inside `lane_<i>/` (runtime/lanes/lanes.py builds them).
LANE_ENQUEUE = "enqueue"              # the body's run fills the lane's queue
LANE_MOVE = "move"                    # the merger's dequeue -> enqueue into the stage buffer
LANE_OCCUPANCY = "occupancy"          # the buffer's size right after the move
LANE_SIZE = "size"                    # the lane queue's size
LANE_DISCARD = "discard"              # drops one batch (re-initialisation)


def input_tasks_marker(stage: str) -> str:
    """The marker NoOp's name for `stage`.

        before:  "stage"
        after:   "stage/input_tasks"
    """
    return f"{stage}/{INPUT_TASKS_MARKER}"


def input_task_scope(stage: str, task: int | str) -> str:
    """The scope of task `task`'s copies of `stage`'s nodes, with its trailing slash.

        before:  ("stage", 1)
        after:   "stage/input_task_1/"
    """
    return f"{stage}/{INPUT_TASK_SCOPE.format(task)}/"


def folded_stage_of(read: str) -> str | None:
    """The stage whose fold added the iterator read `read` (None: not a folded stage's read).

        before:  "stage/dataset_fold/IteratorGetNext"
        after:   "stage"
    """
    stage, _, tail = read.rpartition(f"/{DATASET_FOLD_SCOPE}/")
    return stage if stage and tail == FOLDED_READ else None


def lane_scope(index: int) -> str:
    """The name scope of lane `index` inside a stage's lanes scope: "lane_<index>"."""
    return f"lane_{index}"


@dataclass(frozen=True)
class LaneNames:
    """The names of lane `<prefix>`'s ops and tensors, as the runtime looks them up in a built graph.

        before:  LaneNames.of("stage/lanes", 0)
        after:   .enqueue == "stage/lanes/lane_0/enqueue", .size == "stage/lanes/lane_0/size:0"
    """

    prefix: str  # "<stage>/lanes/lane_<i>"

    @classmethod
    def of(cls, scope: str, index: int) -> "LaneNames":
        return cls(f"{scope}/{lane_scope(index)}")

    def _op(self, name: str) -> str:
        return f"{self.prefix}/{name}"

    @property
    def enqueue(self) -> str:
        return self._op(LANE_ENQUEUE)

    @property
    def move(self) -> str:
        return self._op(LANE_MOVE)

    @property
    def occupancy(self) -> str:
        return self._op(LANE_OCCUPANCY) + ":0"

    @property
    def size(self) -> str:
        return self._op(LANE_SIZE) + ":0"

    @property
    def discard(self) -> str:
        return self._op(LANE_DISCARD)


__all__ = ["ATTR_CUT", "ATTR_MODE", "ATTR_TASKS", "ATTR_THREADS_PER_TASK", "ATTR_TIMEOUT", "BATCH_BYTES",
           "DATASET_FOLD_SCOPE", "FOLDED_READ", "HEAD_TARGETS", "folded_stage_of",
           "INPUT_TASKS_MARKER", "INPUT_TASK_SCOPE", "LANE_DISCARD", "LANE_ENQUEUE", "LANE_MOVE",
           "LANE_OCCUPANCY", "LANE_SCOPES", "LANE_SIZE", "LANES_SCOPE", "LaneNames", "PUT_OCCUPANCY",
           "REMOTE_LANES_SCOPE", "input_task_scope", "input_tasks_marker", "lane_scope"]
