"""The graph model, the lowest layer of the optimizer core: what a graph is, read once.

    load        load_graph(path | GraphDef | MetaGraphDef | tf.Graph) -> LoadedGraph; write_graph(...)
    eager       require_graph_mode(...): the v1 entry points' guard in TensorFlow 2's eager mode
    names       parse_tensor_name("emb/lookup:1") -> TensorName('emb/lookup', 1): the one tensor-name parser
    op_types    which op types are variables, feeds, control flow, inputs, random ...; OpDef facts; is_ref_dtype
    view        GraphView(graph_def): a read-only index (fanins, fanouts, output types), with its topological
                order (order, topological_order) and cycle search (check_acyclic)
    edits       the edit log: AddNode, SetInputs, SetAttr, ... as data; apply_to_graph_def(graph_def, edits)
    rewrites    a TF2 split's rewrites of its step's graph, each one call: replace_nodes (the captures' stand-ins),
                cut(graph_def, moved, inputs, boundary, shapes) -> Sides (the prefetch and main sides)
    heads       the head/body rule of a prefetch side (HeadRule: LANES for the runtime, INPUT_TASKS for the pass)
    stages      StageBoundary and find_stages(view): the stage model every layer above shares
    stage_names the names of the ops added beside a stage: the input-tasks marker, the lanes' ops

Import the names from their module (`from smartstage.graph.view import GraphView`).
"""
