"""Inspection: what a rewrite changed and why, shown as data, text and pictures. Nothing here runs in a
training job.

    diff            GraphDiff: moved, pinned with reasons, added, removed, rewired, device changes
    explain         explain(result, node): why a node moved or stayed, with the chain from its cause
    sides, chains   which side each node is on; the pin chains behind explain
    attr_text       readable attribute values
    replay          run a graph N steps in a session; compare two runs
    verify_rewrite  `smartstage verify`: optimize, replay both, compare step by step
    render/         text, JSON, DOT/SVG, HTML, TensorBoard renderers of a GraphDiff
"""
