"""What may reach a workload's process: the rules every string of a launch follows, checked where a job is submitted
(gpupool.protocol.api, JobCreate) and again where it is launched (gpupool.protocol.agent, Launch), so that no input
can make a launch crash the agent (issue 41, finding 4).

exec(2) takes C strings: a NUL would end one early, and Python refuses it ("embedded null byte"); every string must
encode as UTF-8, which a lone surrogate (allowed by JSON as "\\ud800") does not; Linux takes at most MAX_ARG_STRLEN
(128 KiB) in one argument or "NAME=value". Variable names are POSIX's portable names. A working directory is an
absolute, normalised path. All of a launch's strings together stay within half of a launch frame, measured as the
frame carries them (JSON), so an order always fits its frame (MAX_FRAME_BYTES).

Jobs may not set the variables gpupool sets for them (RESERVED_ENV, RESERVED_ENV_PREFIXES: the workload's identity,
its GPUs, the MPS limits of a fraction); the control plane itself sets `GPUPOOL_TASK_INDEX` in the order, so only
the API refuses those names.
"""

from __future__ import annotations

import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from typing import Annotated

from pydantic import AfterValidator

MAX_ARGS = 256
MAX_ITEM_BYTES = 64 * 1024  # one argument or value, UTF-8: half of Linux's MAX_ARG_STRLEN
MAX_ENV_NAME = 256
MAX_WORKDIR = 1024
MAX_LAUNCH_BYTES = 512 * 1024  # command, env (secret or not), workdir and image together, as JSON: half a frame
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: variables gpupool sets for every workload (agent/runtime/process.py gpupool_env), and the device variables that
#: decide which GPUs a container sees (the NVIDIA container toolkit reads them)
RESERVED_ENV = frozenset({"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "NVIDIA_MIG_CONFIG_DEVICES",
                          "NVIDIA_MIG_MONITOR_DEVICES"})
RESERVED_ENV_PREFIXES = ("GPUPOOL_", "CUDA_MPS_")  # identity and fractions; MPS settings enforce a fraction's share


def process_text(value: str) -> str:
    """`value` when a process may be given it (see the module docstring); else ValueError saying why, never quoting
    it (it may be a secret)."""
    if "\x00" in value:
        raise ValueError("must not contain a NUL character")
    try:
        size = len(value.encode())
    except UnicodeEncodeError:
        raise ValueError("must be text that UTF-8 can encode (no lone surrogate)") from None
    if size > MAX_ITEM_BYTES:
        raise ValueError(f"must be at most {MAX_ITEM_BYTES} bytes (UTF-8), not {size}")
    return value


def env_name(key: str) -> str:
    """`key` when it is a portable environment variable name of at most MAX_ENV_NAME characters; else ValueError."""
    if len(key) > MAX_ENV_NAME or not ENV_NAME.fullmatch(key):
        raise ValueError(f"is not a variable name: letters, digits and _, not starting with a digit, at most "
                         f"{MAX_ENV_NAME} characters")
    return key


def job_env_name(key: str) -> str:
    """`key` when a job may set it: `env_name`, and not one of the variables gpupool sets; else ValueError."""
    env_name(key)
    if key in RESERVED_ENV or key.startswith(RESERVED_ENV_PREFIXES):
        raise ValueError(f"is reserved: gpupool sets {', '.join(sorted(RESERVED_ENV))} and "
                         f"{', '.join(p + '*' for p in RESERVED_ENV_PREFIXES)} itself")
    return key


def workdir(value: str) -> str:
    """`value` when it is an absolute, normalised path (no ".", "..", "//" or trailing "/") that a process may be
    given; else ValueError."""
    process_text(value)
    if len(value) > MAX_WORKDIR:
        raise ValueError(f"must be at most {MAX_WORKDIR} characters")
    if not value.startswith("/"):
        raise ValueError("must be an absolute path")
    if posixpath.normpath(value) != value or value.startswith("//"):
        raise ValueError("must be a normalised path: no '.', '..', '//' or trailing '/'")
    return value


def fits_a_frame(strings: Iterable[str], *envs: Mapping[str, str]) -> None:
    """ValueError when `strings` and the names and values of `envs` take more than MAX_LAUNCH_BYTES as a launch
    frame carries them (JSON, UTF-8: a control character takes six bytes there)."""
    texts = [*strings, *(text for env in envs for pair in env.items() for text in pair)]
    size = sum(len(json.dumps(text, ensure_ascii=False).encode()) for text in texts)
    if size > MAX_LAUNCH_BYTES:
        raise ValueError(f"command, env, secret_env, workdir and image: {size} bytes together, more than "
                         f"{MAX_LAUNCH_BYTES}")


Arg = Annotated[str, AfterValidator(process_text)]
EnvName = Annotated[str, AfterValidator(env_name)]
JobEnvName = Annotated[str, AfterValidator(job_env_name)]
EnvValue = Annotated[str, AfterValidator(process_text)]
Workdir = Annotated[str, AfterValidator(workdir)]
