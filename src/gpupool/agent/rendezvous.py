"""A gang's rendezvous on this node: the variables torchrun, NCCL and MPI read, the hostfile, and the port task 0's
agent holds for MASTER_PORT (gpupool.protocol.agent.Rendezvous)."""

from __future__ import annotations

import socket

from gpupool.protocol.agent import Rendezvous

HOSTFILE = "hostfile"


def hold_free_port() -> socket.socket:
    """A TCP socket bound (not listening) to a free port on every interface, with SO_REUSEADDR: while it is open no
    other process is given the port, yet the task may bind and listen on it (torch's store and Python's
    `socket.create_server` set SO_REUSEADDR too). The agent closes it once the task has started."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", 0))
    except OSError:
        sock.close()
        raise
    return sock


def rendezvous_env(rendezvous: Rendezvous) -> dict[str, str]:
    """WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT, and GPUPOOL_HOSTS (the hostfile's
    lines joined by commas, for workloads that cannot read the file, e.g. in a container)."""
    return {
        "WORLD_SIZE": str(rendezvous.world_size),
        "RANK": str(rendezvous.rank),
        "LOCAL_RANK": str(rendezvous.local_rank),
        "LOCAL_WORLD_SIZE": str(rendezvous.local_world_size),
        "MASTER_ADDR": rendezvous.master_addr,
        "MASTER_PORT": str(rendezvous.master_port),
        "GPUPOOL_HOSTS": ",".join(f"{h.address}:{h.slots}" for h in rendezvous.hosts),
    }


def hostfile_text(rendezvous: Rendezvous) -> str:
    """One line per node, "ADDRESS slots=N" (as OpenMPI and DeepSpeed read it), task 0's node first."""
    return "".join(f"{h.address} slots={h.slots}\n" for h in rendezvous.hosts)
