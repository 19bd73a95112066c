"""Inspection: what a rewrite changed and why, shown as data, text and pictures. Nothing here runs in a
training job.

    diff            GraphDiff: moved, pinned with reasons, added, removed, rewired, device changes
    explain         explain(result, node): why a node moved or stayed, with the chain from its cause
    sides, chains   which side each node is on; the pin chains behind explain
    attr_text       readable attribute values
    replay          run a graph N steps in a session; compare two runs
    verify_rewrite  `smartstage verify`: optimize, replay both, compare step by step
    placement       scale-out: which input task runs what, what stays on the trainer, what crosses per batch
    loopback        a trainer and N input-task servers on 127.0.0.1 (verify of a graph placed on input tasks)
    render/         text, JSON, DOT/SVG, HTML, TensorBoard renderers of a GraphDiff
"""
