"""The graph model, the lowest layer of the optimizer core: what a graph is, read once.

    load        load_graph(path | GraphDef | MetaGraphDef | tf.Graph) -> LoadedGraph; write_graph(...)
    names       parse_tensor_name("emb/lookup:1") -> TensorName('emb/lookup', 1): the one tensor-name parser
    op_types    which op types are variables, feeds, control flow, inputs, random ...; OpDef facts
    view        GraphView(graph_def): a read-only index (fanins, fanouts, output types)
    edits       the edit log: AddNode, SetInputs, SetAttr, ... as data; apply_to_graph_def(graph_def, edits)
    order       topological order and cycle search over a GraphView
    stages      StageBoundary and find_stages(view): the stage model every layer above shares

Import the names from their module (`from smartstage.graph.view import GraphView`).
"""
