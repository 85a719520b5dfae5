"""A gang task's rendezvous on its node (gpupool.agent.rendezvous)."""

from __future__ import annotations

import socket

from gpupool.agent.rendezvous import hold_free_port, hostfile_text, rendezvous_env
from gpupool.protocol.agent import GangHost, Rendezvous


def test_the_held_port_is_free_for_the_task_to_listen_on_while_held():
    held = hold_free_port()
    try:
        port = held.getsockname()[1]
        with socket.create_server(("", port)) as server, socket.create_connection(("127.0.0.1", port), timeout=5):
            server.accept()[0].close()
    finally:
        held.close()


def test_the_variables_and_the_hostfile():
    r = Rendezvous(world_size=3, rank=2, local_rank=1, local_world_size=2, master_addr="10.0.0.1", master_port=29500,
                   hosts=[GangHost(address="10.0.0.1", slots=1), GangHost(address="10.0.0.2", slots=2)])
    assert rendezvous_env(r) == {"WORLD_SIZE": "3", "RANK": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                                 "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500",
                                 "GPUPOOL_HOSTS": "10.0.0.1:1,10.0.0.2:2"}
    assert hostfile_text(r) == "10.0.0.1 slots=1\n10.0.0.2 slots=2\n"
