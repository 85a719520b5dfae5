"""`python -m gpupool.server`: run the control plane (what `gpupool server` and `gpupool up` start)."""

from __future__ import annotations

import argparse
import sys

import uvicorn

from gpupool.server.app import create_app
from gpupool.server.settings import Settings


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpupool server", description="Run the gpupool control plane.")
    parser.add_argument("--data-dir", default="gpupool-data")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(data_dir=args.data_dir, host=args.host, port=args.port,
                                     database_url=args.database_url, profile=args.profile)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
