"""`why` on a placed job whose node has not started it (issue 42: two jobs sat `scheduled` for minutes after a
failover while `why` said only "not pending: the job is scheduled"): it names the node, the node's state, the task
and since when it waits. The node here is registered by hand and never opens its channel, as an agent that cannot
reach the leader."""

from __future__ import annotations

from datetime import datetime

from test_workload_isolation import register, settled, submit

from gpupool.devtools.harness import Server


def test_a_scheduled_job_says_which_node_it_waits_for_and_since_when(server: Server) -> None:
    with server.client() as c:
        register(c, "silent", gpus=1, untrusted_images=False)
        job_id = submit(c, gpus="1")
        placed = settled(c, job_id)
        assert placed["state"] == "scheduled" and placed["allocations"][0]["node"] == "silent", placed
        why = c.get(f"/jobs/{job_id}/why").json()
        assert why["kind"] == "waiting_for_node", why
        assert "waiting for 1 task(s) to be started by the agent of silent (ready)" in why["message"], why
        [detail] = why["details"]
        assert (detail["task"], detail["node"], detail["node_state"]) == (0, "silent", "ready"), detail
        assert datetime.fromisoformat(detail["since"]).tzinfo is not None
        c.post(f"/jobs/{job_id}/cancel")
