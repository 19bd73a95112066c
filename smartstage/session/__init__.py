"""SmartStage inside a training session: the flag on a config, and the live graph rewritten in place.

    session          ss.Session(config=...): reads the flags, rewrites the default graph before the first step
    monitored        ss.MonitoredTrainingSession(...): the same for the monitored loop
    live_rewrite     runs optimize() on an export of the live tf.Graph, applies the passes' edit logs to it,
                     records what moved; adopt_late_ops for ops built after the rewrite
    live_edits       apply_to_live_graph(graph, edits): the edit log (graph/edits.py) written into a live
                     tf.Graph in place (new stage ops where the boundary dtypes change, names and handles kept)
    record           LiveRewrite / LiveStage: what a live rewrite did, kept per graph
    fetches          maps a fetch or feed of a moved tensor to the take output of the same batch

Import the names from their module (`from smartstage.session.session import Session`).
"""
