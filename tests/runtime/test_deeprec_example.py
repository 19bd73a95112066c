"""The DeepRec-style Stage script (tests/deeprec_scripts.py) runs on the staging runtime with only its
import changed, and its stage is described in the graph."""

from __future__ import annotations

import smartstage.runtime as ss
from tests.deeprec_scripts import STAGE_SCRIPT, run_script


def test_deeprec_stage_script_runs(tmp_path):
    data = tmp_path / "1.txt"
    data.write_text("".join(f"user{i},item{i}\n" for i in range(7)))
    printed, names = run_script(STAGE_SCRIPT, str(data))
    assert len(printed) == 5
    assert sum(p.count("xxx") for p in printed) == 10            # 5 steps, the 'xxx' row twice each
    assert sum(p.count("1.000000") for p in printed) == 5 * 6    # the looked-up rows of ones, as strings
    graph = names["target"].graph
    assert ss.target_node_names(graph) == [names["target"].op.name]
    (stage,) = ss.stage_defs(graph)
    assert stage.boundary_tensors == ["DecodeCSV:0", "DecodeCSV:1"]
