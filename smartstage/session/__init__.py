"""SmartStage inside a training session: the flag on a config, and the live graph rewritten in place.

    session          ss.Session(config=...): reads the flags, rewrites the default graph before the first step
    monitored        ss.MonitoredTrainingSession(...): the same for the monitored loop
    live_rewrite     applies an OptimizeResult to the live tf.Graph (names and handles kept)
    live_auto_stage  inserts auto-stage's stages into the live tf.Graph
    record           LiveRewrite / LiveStage: what a live rewrite did, kept per graph
    fetches          maps a fetch or feed of a moved tensor to the take output of the same batch

Import the names from their module (`from smartstage.session.session import Session`).
"""
