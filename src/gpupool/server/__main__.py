"""`python -m gpupool.server`: run the control plane (what `gpupool server` and `gpupool up` start);
`python -m gpupool.server rotate-master-key --data-dir D`: rotate the master key of job secrets.

`kill -USR1 PID` makes a running control plane write every thread's stack to its log (stderr) and carry on:
what to look at when it seems stuck."""

from __future__ import annotations

import argparse
import faulthandler
import os
import signal
import socket
import sys
import traceback

import uvicorn
from sqlalchemy.exc import DBAPIError

from gpupool.server import failpoints, keyring
from gpupool.server.app import create_app, server_options
from gpupool.server.db.engine import Database, debug, failure, migrate
from gpupool.server.db.migrating import SchemaMismatch
from gpupool.server.settings import Settings


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["rotate-master-key"]:
        return rotate(argv[1:])
    parser = argparse.ArgumentParser(prog="gpupool server", description="Run the gpupool control plane.")
    parser.add_argument("--data-dir", default="gpupool-data")
    parser.add_argument("--host", default=None)
    parser.add_argument("--port", type=int, default=None)
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--profile", default=None)
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    try:
        failpoints.configure()
        settings = Settings.from_env(data_dir=args.data_dir, host=args.host, port=args.port,
                                     database_url=args.database_url, profile=args.profile,
                                     kubeconfig=args.kubeconfig)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:  # before serving: a schema that cannot be migrated safely is refused with its reason, not a traceback
        settings.data_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        settings.data_dir.chmod(0o700)  # keys, tokens, database and logs: the service user's alone (issue 41)
        migrate(settings.db_url)
    except SchemaMismatch as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    except DBAPIError as exc:  # a wrong password, a database down or missing: one line, the traceback on --debug
        if debug():
            traceback.print_exc()
        print(f"error: {failure(exc, settings.db_url)}", file=sys.stderr)
        return 3
    taken = ports_taken(settings)
    if taken:
        print(f"error: {taken}", file=sys.stderr)
        return 3
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    uvicorn.run(create_app(settings), host=settings.host, port=settings.port, log_level=args.log_level,
                **server_options(settings))
    return 0


def ports_taken(settings: Settings) -> str | None:
    """Why the API's or the agent channel's port cannot be listened on (one line naming the port and the setting
    that moves it), or None. Checked before serving: a port taken after this check still fails the start, with
    uvicorn's message."""
    for what, port, moves in (("the API", settings.port, "--port or GPUPOOL_PORT"),
                              ("the agent channel", settings.channel_port, "GPUPOOL_AGENT_PORT (default: the API "
                                                                           "port + 1; 0 takes any free port)")):
        if port == 0:
            continue
        try:
            socket.create_server((settings.host, port), family=_family(settings.host)).close()
        except OSError as exc:
            why = os.strerror(exc.errno) if exc.errno else str(exc)
            return f"{what} cannot listen on {settings.host}:{port}: {why}; choose another with {moves}"
    return None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def rotate(argv: list[str]) -> int:
    """`python -m gpupool.server rotate-master-key`: re-wrap every data key with a new master key (the control plane
    may keep running; it picks the new key up). Exit 1 when anything is left undecryptable."""
    parser = argparse.ArgumentParser(prog="gpupool rotate-master-key", description=rotate.__doc__)
    parser.add_argument("--data-dir", default="gpupool-data")
    parser.add_argument("--database-url", default=None)
    parser.add_argument("--master-key-file", default=None, help="default: DATA_DIR/master.key")
    args = parser.parse_args(argv)
    try:
        settings = Settings.from_env(data_dir=args.data_dir, database_url=args.database_url,
                                     master_key_file=args.master_key_file)
        report = keyring.rotate_master_key(Database(settings.db_url), settings.master_key_path)
    except (ValueError, keyring.KeyringError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"master key {report.old_key_id} -> {report.new_key_id}: data_keys={report.data_keys} "
          f"job_secrets={report.job_secrets} undecryptable={report.undecryptable}")
    return 1 if report.undecryptable else 0


if __name__ == "__main__":
    raise SystemExit(main())
