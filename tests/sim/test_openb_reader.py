"""openb CSV readers: real files parse; malformed rows are rejected with file:line and column."""

from __future__ import annotations

import pytest

from gpupool.sim.traces.errors import TraceError
from gpupool.sim.traces.openb import read_nodes, read_pods

POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
)
GOOD_POD = "p0,1000,1024,1,500,,LS,Running,0,10,0\n"


def test_real_openb_files_parse(openb):
    nodes = read_nodes(openb / "openb_node_list_gpu_node.csv")
    assert len(nodes) == 1213 and sum(len(n.gpus) for n in nodes) == 6212
    pods = read_pods(openb / "openb_pod_list_default.csv")
    assert len(pods) == 8152
    assert len(read_pods(openb / "openb_pod_list_multigpu50.csv")) == 9061  # 5-column variant
    constrained = read_pods(openb / "openb_pod_list_gpuspec33.csv")
    assert sum(1 for p in constrained if p.shape.gpu_models) == 2388


def test_pods_of_equal_shape_share_one_shape_object(openb):
    pods = read_pods(openb / "openb_pod_list_default.csv")
    distinct = {p.shape for p in pods}
    assert len({id(p.shape) for p in pods}) == len(distinct) < 200


@pytest.mark.parametrize(
    ("row", "line", "column"),
    [("p1,abc,1024,1,500,,LS,Running,0,10,0\n", 3, "cpu_milli"),
     ("p1,1000,1024,2,500,,LS,Running,0,10,0\n", 3, "gpu_milli"),
     ("p1,1000,1024,1,500,,LS,Running,0,-5,0\n", 3, "deletion_time"),
     ("p1,1000,1024,1,500\n", 3, "-"),
     ("p0,1000,1024,1,500,,LS,Running,0,10,0\n", 3, "name")],
    ids=["non-numeric cpu", "fraction of two GPUs", "negative time", "short row", "duplicate name"],
)
def test_malformed_pod_rows_name_file_line_and_column(tmp_path, row, line, column):
    path = tmp_path / "pods.csv"
    path.write_text(POD_HEADER + GOOD_POD + row)
    with pytest.raises(TraceError) as info:
        read_pods(path)
    assert info.value.line == line and info.value.column == column
    assert str(info.value).startswith(f"{path}:{line}:")


def test_node_rows_need_a_model_when_they_have_gpus(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,memory_mib,gpu,model\nn0,1000,1024,2,\n")
    with pytest.raises(TraceError, match=r"nodes.csv:2: column 'model'"):
        read_nodes(path)


def test_missing_column_is_reported_on_the_header_line(tmp_path):
    path = tmp_path / "nodes.csv"
    path.write_text("sn,cpu_milli,gpu,model\nn0,1000,2,T4\n")
    with pytest.raises(TraceError, match=r":1: column 'memory_mib'"):
        read_nodes(path)
