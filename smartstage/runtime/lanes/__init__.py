"""The lanes: everything that exists only for a stage whose buffer SmartStage's own threads fill.

A stage comes here when the passes leave it unfolded (a queue reader, a feed_dict, input tasks, an error
policy a dataset cannot honour, a random op or other state on its prefetch side, tf_data_stage="lanes", a
plain stock Session). Nothing outside this package imports it but smartstage.runtime.door, and only when a
graph has such a stage, so a session whose stages all folded never loads it (tests/test_layers.py).

    split.py, lanes.py, batch_bytes.py   the serial head, the ordered lanes (fed the head's values)
    remote.py                             lanes on input tasks; prepare_all_lanes (the door's build)
    saved_inputs.py                       a lanes stage on a checkpointed iterator warns once
    tuning/                               measurements in, lanes / capacity / pool out
    producers/                            the threads: ordered, sharded, unordered; start_prefetch_threads
"""
