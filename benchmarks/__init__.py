"""SmartStage benchmarks: steps/sec against every alternative, and the cost of optimize() as graphs grow.

    python -m benchmarks.e2e [--quick]        # DLRM-like and Wide&Deep-like training, every configuration
    python -m benchmarks.scaling [--quick]    # optimize() vs import_graph_def on 10k / 100k / 1M nodes
    python -m benchmarks.ports [--quick]      # DeepRec model-zoo-style scripts, SmartStage flag off vs on
    python -m benchmarks.boundary_cost        # what each tensor a stage carries costs, as is and packed

Results go to benchmarks/out/ (git-ignored); `--publish` also copies the JSON and PNG to docs/perf/.
The latest tables are in docs/performance.md (and README.md).
"""
