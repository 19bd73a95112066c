"""fold_fit: whether a stage folds into its iterator's dataset, and what moves (analysis only).

    before:  it -> IteratorGetNext -> lookup(table) -> put ~~ take -> loss      (MakeIterator(batch, it))
    after:   FoldFit(read="IteratorGetNext", iterator="it", makers=("MakeIterator",), body=("Const", "lookup"),
                     captures=("hash_table:0",), outputs=("lookup:0",), removed=("stage/buffer", ...))

The checks are passes/dataset_rules.py's, at its FOLD destination (the tf.data-service pass runs the same ones);
the pass that applies a FoldFit is passes/fold_dataset.py (its docstring says what folds and why).
Everything here reads the graph and returns data.
"""

from __future__ import annotations

from dataclasses import dataclass

from smartstage.graph.op_types import INITIALIZABLE_ITERATORS, ONE_SHOT_ITERATORS
from smartstage.graph.stages import StageBoundary
from smartstage.graph.view import GraphView
from smartstage.passes.dataset_rules import FOLD, movable_body
from smartstage.protos import AUTOTUNE

SCOPE = "dataset_fold"  # <stage>/dataset_fold/<node>: the nodes this pass adds
# Why do_smart_stage_gpu keeps the stage's buffer (checked on TensorFlow 2.21, v1 graph): prefetch_to_device
# and copy_to_device make the dataset a GeneratorDataset on the device, and the iterator, its MakeIterator and
# IteratorGetNext must then be placed there with it; a GeneratorDataset "does not support checkpointing", so
# the user's saveable iterator would fail to save. The GPU-resident buffer keeps the copy off the step.
GPU_REASON = ("do_smart_stage_gpu: the GPU-resident buffer keeps the host-to-device copy off the step; tf.data's "
              "prefetch_to_device moves the iterator to the device and cannot be checkpointed")


@dataclass(frozen=True)
class FoldFit:
    """Whether one stage folds into its iterator's dataset, and what moves: analysis only.

        before:  it -> IteratorGetNext -> sqrt -> put ~~ take -> loss        (MakeIterator(batch, it))
        after:   FoldFit(read="IteratorGetNext", iterator="it", makers=("MakeIterator",), body=("Sqrt",),
                         outputs=("Sqrt:0",), removed=("stage/buffer", "stage/put", "stage/take", ...))
    """

    stage: str
    put: str = ""
    take: str = ""
    read: str = ""                   # the IteratorGetNext the put reads through the body
    iterator: str = ""               # the iterator op (keeps its name)
    makers: tuple[str, ...] = ()     # its MakeIterator ops (initializable iterators): one map per dataset
    one_shot: bool = False           # a OneShotIterator: its dataset_factory gets the map
    body: tuple[str, ...] = ()       # run inside the map, in graph order
    kept: tuple[str, ...] = ()       # body nodes not computed from the batch that others read too: copied
    captures: tuple[str, ...] = ()   # table handles the map reads by reference
    outputs: tuple[str, ...] = ()    # the put's data inputs: what the iterator yields, in order
    waits: tuple[str, ...] = ()      # body ops every element waits for (checks the step waited on)
    removed: tuple[str, ...] = ()    # the stage's own ops (buffer, put, take, guard, ...): they leave the graph
    num_parallel_calls: int = AUTOTUNE
    buffer_size: int = AUTOTUNE
    deterministic: bool = True
    keeps_buffer: bool = False       # do_smart_stage_gpu: the map folds, the stage keeps its (GPU) buffer
    skipped: str = ""                # why the stage keeps its buffer (and lanes)

    @property
    def folds(self) -> bool:
        return not self.skipped


def fold_fit(view: GraphView, stage: StageBoundary, side: frozenset[str], targets: set[str]) -> FoldFit:
    """Whether `stage` (after expand_stage) folds into its iterator's dataset; `side`: the put's prefetch side.

        before:  it -> IteratorGetNext -> lookup(table) -> put ~~ take       (MakeIterator(batch, it))
        after:   FoldFit(body=("Const", "LookupTableFindV2"), captures=("hash_table:0",), makers=("MakeIterator",))
    """
    moved = movable_body(view, stage, side, targets, FOLD)
    if not moved.moves:
        return FoldFit(stage.name, skipped=moved.skipped)
    stage_def = stage.stage_def  # a body moves at FOLD only for a stage with a StageDef
    return FoldFit(stage.name, stage.put, stage.take, moved.read, moved.iterator, moved.makers, moved.one_shot,
                   moved.body, moved.kept, moved.captures, moved.outputs, moved.waits, moved.removed,
                   num_parallel_calls=stage_def.num_threads if stage_def.num_threads > 0 else AUTOTUNE,
                   buffer_size=stage_def.capacity if stage_def.capacity > 0 else AUTOTUNE,
                   deterministic=not stage_def.unordered)


__all__ = ["AUTOTUNE", "GPU_REASON", "INITIALIZABLE_ITERATORS", "ONE_SHOT_ITERATORS", "SCOPE", "FoldFit", "fold_fit"]
