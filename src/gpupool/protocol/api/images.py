"""Container image references, the registries they name, and secrets: what a job may ask to run."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Collection

from gpupool.protocol import launch

_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[a-fA-F0-9:.]+\])"
_REMOTE = re.compile(rf"(?P<path>{_PATH}(?:/{_PATH})*)(?::[\w][\w.-]{{0,127}})?"
                     r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?", re.ASCII)
_REGISTRY = re.compile(rf"{_DOMAIN}(?::[0-9]{{1,5}})?", re.ASCII)
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+", re.IGNORECASE)
MAX_IMAGE_NAME = 255
#: registry host names that always mean this machine or a cloud's metadata service
LOCAL_HOSTS = ("localhost", "metadata.google.internal")


def image_registry(reference: str) -> str:
    """The registry ("host" or "host:port", "" for the default registry) of a well-formed image reference;
    ValueError naming what is wrong otherwise. The first path component is a registry when it has a dot or a
    colon or is "localhost" (docker's rule)."""
    first, slash, rest = reference.partition("/")
    has_registry = bool(slash) and (any(c in first for c in ".:[") or first == "localhost")
    registry, remote = (first, rest) if has_registry else ("", reference)
    if registry and not _REGISTRY.fullmatch(registry):
        raise ValueError(f"{registry!r} is not a registry host[:port]")
    match = _REMOTE.fullmatch(remote)
    if match is None or len(registry) + 1 + len(match["path"]) > MAX_IMAGE_NAME:
        raise ValueError("not an image reference: [registry[:port]/]path[:tag][@digest], lower case path "
                         f"components, at most {MAX_IMAGE_NAME} characters of name")
    return registry


def registry_allow(setting: str) -> frozenset[str]:
    """The hosts of a comma-separated allow list ("host" or "host:port" each), lower-cased."""
    return frozenset(entry.strip().lower() for entry in setting.split(",") if entry.strip())


def registry_problem(reference: str, allowed: Collection[str]) -> str | None:
    """Why a well-formed image `reference` may not be pulled, or None: see `_host_problem`; a registry ("host:port")
    or host in `allowed` may always be pulled from."""
    registry = image_registry(reference).lower()
    host = registry[: registry.index("]") + 1] if registry.startswith("[") else registry.partition(":")[0]
    if not registry or registry in allowed or host in allowed:
        return None
    problem = _host_problem(host.strip("[]"))
    return problem and f"registry host {host!r} is {problem}; an operator may allow it with GPUPOOL_REGISTRY_ALLOW"


def _host_problem(host: str) -> str | None:
    """What makes `host` a registry not to pull from unasked: a loopback, private, link-local (cloud metadata) or
    otherwise non-global address; a numeric host that is not a plain address (resolvers read "0177.1" or
    "2130706433" as one); a name of this machine or of a metadata service. None for anything else."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if all(_NUMERIC_LABEL.fullmatch(label) for label in host.split(".")):
            return "a numeric host that is not a plain address"
        if host in LOCAL_HOSTS or host.endswith(".localhost"):
            return "this machine or a metadata service"
        return None
    mapped = address.ipv4_mapped if isinstance(address, ipaddress.IPv6Address) else None
    return None if (mapped or address).is_global else "a loopback, private, link-local or metadata address"


MAX_SECRET_CHARS = 16_384


def _secret_value(secret: str) -> str:
    """A secret variable's value: what a process may be given (protocol.launch), at most MAX_SECRET_CHARS."""
    if len(secret) > MAX_SECRET_CHARS:
        raise ValueError(f"must be at most {MAX_SECRET_CHARS} characters")
    return launch.process_text(secret)
