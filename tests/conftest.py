from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def shared_dir() -> Path:
    """The read-only shared material: $GPUPOOL_SHARED, else ../shared next to the repo, else /work/shared."""
    for candidate in (os.environ.get("GPUPOOL_SHARED"), REPO.parent / "shared", "/work/shared"):
        if candidate and (Path(candidate) / "traces").is_dir():
            return Path(candidate)
    return REPO.parent / "shared"


OPENB = shared_dir() / "traces" / "alibaba-gpu-v2023"


@pytest.fixture(scope="session")
def openb() -> Path:
    if not (OPENB / "openb_node_list_gpu_node.csv").is_file():
        pytest.skip(f"shared openb trace not found at {OPENB}")
    return OPENB
