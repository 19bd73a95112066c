"""The SmartStage passes, one per module, and the order the flags put them in.

    find_stages -> [auto_stage] -> partition -> expand_stage -> [fold_dataset] -> [gpu_placement] -> [multi_stream]
        -> [input_tasks | tfdata_service]

fold_dataset runs when options.tf_data_stage == "fold" (the default) and the input stays in this process
(no input_job, no tf.data service): a stage reading a tf.data iterator becomes the dataset's map and
prefetch; the stages it cannot fold keep their buffer for the passes after it.

partition_inputs is the partition's entry for a graph whose boundary is its own inputs (a TF2 step's function
graph): analysis only, outside this order.
"""

from __future__ import annotations


def passes_for(options) -> list:
    """The passes `options` (a SmartStageOptions) ask for, in their fixed order."""
    from smartstage.passes.expand_stage import ExpandStage
    from smartstage.passes.find_stages import FindStages
    from smartstage.passes.partition import Partition

    passes: list = [FindStages()]
    if options.auto_stage is not None:
        from smartstage.passes.auto_stage import AutoStage

        passes.append(AutoStage())
    passes += [Partition(), ExpandStage()] if options.expand else [Partition()]
    if options.tf_data_stage == "fold" and options.input_mode != "tf_data_service" and not options.input_job:
        from smartstage.passes.fold_dataset import FoldDataset

        passes.append(FoldDataset())
    if options.do_smart_stage_gpu:
        from smartstage.passes.gpu.placement import GpuPlacement

        passes.append(GpuPlacement())
    if options.stage_multi_stream:
        from smartstage.passes.gpu.multi_stream import MultiStream

        passes.append(MultiStream())
    if options.input_mode == "tf_data_service":
        from smartstage.passes.tfdata_service import TfDataService

        passes.append(TfDataService())
    elif options.input_job:
        from smartstage.passes.input_tasks import InputTasks

        passes.append(InputTasks())
    return passes


__all__ = ["passes_for"]
