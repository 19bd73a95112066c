"""Example models and synthetic data: what `smartstage demo`, the tests and the benchmarks train, and what a
user can import to try SmartStage on a realistic graph without writing a model first.

What users import: `prepare_criteo` (synthetic Criteo-format CSV and vocabulary files), `build_dlrm`,
`build_wide_deep` and `build_demo` (training graphs with a `stage_fn` hook, e.g. `ss.staged`), and
`run_steps` (run a model's fetches for N steps). The rest serves the benchmarks (timing, input options).
This package imports no other part of smartstage (tests/test_layers.py checks it): the stage is passed in.

    files = prepare_criteo(tmp_dir, num_rows=2000)                         # CSV + vocabulary files
    model = build_dlrm(files.data_path, files.vocabulary_paths, stage_fn=ss.staged)
    losses = run_steps(model.graph, model.fetches["loss"], steps=20, init_op=model.init_op)

Importing this package imports TensorFlow.
"""

from smartstage.examples.data import (
    ALL_COLUMNS,
    CATEGORICAL_COLUMNS,
    DENSE_COLUMNS,
    CriteoFiles,
    generate_criteo_columns,
    prepare_criteo,
    write_criteo_csv,
    write_deeprec_example_data,
    write_vocabularies,
)
from smartstage.examples.export import (
    export_graph_def,
    export_meta_graph_def,
    import_meta_graph_def,
    write_graph_file,
)
from smartstage.examples.models import (
    DLRMOptions,
    FeatureOptions,
    InputOptions,
    ModelGraph,
    StageFn,
    WideDeepOptions,
    build_demo,
    build_dlrm,
    build_wide_deep,
    deeprec_smart_stage_example,
    no_stage,
)
from smartstage.examples.running import run_steps, steps_per_second

__all__ = [
    "ALL_COLUMNS",
    "CATEGORICAL_COLUMNS",
    "DENSE_COLUMNS",
    "CriteoFiles",
    "DLRMOptions",
    "FeatureOptions",
    "InputOptions",
    "ModelGraph",
    "StageFn",
    "WideDeepOptions",
    "build_demo",
    "build_dlrm",
    "build_wide_deep",
    "deeprec_smart_stage_example",
    "export_graph_def",
    "export_meta_graph_def",
    "generate_criteo_columns",
    "import_meta_graph_def",
    "no_stage",
    "prepare_criteo",
    "run_steps",
    "steps_per_second",
    "write_criteo_csv",
    "write_deeprec_example_data",
    "write_graph_file",
    "write_vocabularies",
]
