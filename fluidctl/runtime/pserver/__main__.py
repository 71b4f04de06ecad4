"""``python -m fluidctl.runtime.pserver``: the parameter-server process.

The launcher starts it with nothing but the environment contract (``fluidctl.envs``):
TRAINING_ROLE=PSERVER, PADDLE_PSERVERS_IP_PORT_LIST + PADDLE_PSERVER_ID (or
PADDLE_CURRENT_ENDPOINT) for the address, PADDLE_TRAINERS_NUM, FLUIDCTL_SYNC_MODE and
FLUIDCTL_JOB_TOKEN. ``fluidctl pserver start`` passes flags instead; a flag wins over the
environment.

SIGTERM or SIGINT: write a checkpoint (when ``--checkpoint-dir`` is set) and exit 0 (1 when
that final checkpoint could not be written).
Bad input (a port in use, an unusable checkpoint directory, an unreadable token file, no job
token at all, a state directory that cannot be written): one line ``error: ...`` and exit 2.
Started by the launcher (TRAINING_ROLE=PSERVER in the environment), it stops when the launcher
is gone: the kernel's parent-death signal, and a check of its parent every second.
"""
from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
from typing import Mapping, Optional, Sequence

from fluidctl import envs
from fluidctl.errors import FluidctlError, UsageError, check_range
from fluidctl.runtime.pserver import MAX_FRAME_MB, MAX_TRAINERS
from fluidctl.runtime.pserver.checkpoint import CheckpointError
from fluidctl.runtime.pserver.server import (DEFAULT_MAX_FRAME, DEFAULT_PORT, PServer,
                                             ServerConfig)


read_token_file = envs.read_token_file


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m fluidctl.runtime.pserver",
                                description="fluidctl parameter server (see docs/pserver.md)")
    p.add_argument("--host", help="address to bind, e.g. 0.0.0.0")
    p.add_argument("--port", type=int, help=f"first port, e.g. {DEFAULT_PORT}; 0 picks one")
    p.add_argument("--ports-num", "--ports_num", type=int, default=1)
    p.add_argument("--ports-num-for-sparse", "--ports_num_for_sparse", type=int, default=0)
    p.add_argument("--trainers", "--num-gradient-servers", "--num_gradient_servers", type=int)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--sync", dest="sync", action="store_true", default=None)
    mode.add_argument("--async", dest="sync", action="store_false")
    p.add_argument("--pserver-id", type=int, help="this server's index among the pservers")
    p.add_argument("--checkpoint-dir")
    p.add_argument("--checkpoint-every", type=int, default=0)
    p.add_argument("--token-file")
    p.add_argument("--max-frame-mb", type=int, default=DEFAULT_MAX_FRAME >> 20)
    p.add_argument("--register-timeout", type=float)
    p.add_argument("--no-state", action="store_true",
                   help="do not write a pid file and state record")
    p.add_argument("--log-file", help="recorded in the state record for `status`")
    p.add_argument("--ready-fd", type=int, help="write the endpoint here once listening")
    p.add_argument("--exit-when-done", action="store_true",
                   help="stop (final checkpoint, exit 0) once every trainer has left, e.g. a "
                        "pserver pod whose job ends when its pservers do")
    p.add_argument("--no-parent-watch", action="store_true",
                   help="keep serving when the process that started this one exits (daemons)")
    return p


def config_from(args: argparse.Namespace, environ: Mapping[str, str]) -> ServerConfig:
    """Flags first, then the environment contract, then defaults."""
    env = envs.read(environ)
    endpoint = env.current_endpoint or (
        env.pserver_endpoints[env.pserver_id]
        if env.role == envs.ROLE_PSERVER and env.pserver_id < len(env.pserver_endpoints) else "")
    env_host, env_port = envs.split_endpoint(endpoint) if endpoint else ("0.0.0.0", DEFAULT_PORT)
    token = read_token_file(args.token_file) if args.token_file else env.token
    cfg = ServerConfig(
        host=args.host or env_host,
        port=args.port if args.port is not None else env_port,
        ports_num=args.ports_num, ports_num_for_sparse=args.ports_num_for_sparse,
        trainers=args.trainers if args.trainers is not None else env.world_size,
        sync=args.sync if args.sync is not None else env.sync,
        pserver_id=args.pserver_id if args.pserver_id is not None else env.pserver_id,
        checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
        token=token, max_frame=args.max_frame_mb << 20,
        register_timeout=args.register_timeout or env.timeout, round_timeout=env.timeout,
        write_state=not args.no_state, log_file=args.log_file,
        exit_when_done=args.exit_when_done,
        watch_parent=environ.get(envs.TRAINING_ROLE) == envs.ROLE_PSERVER and not args.no_parent_watch)
    for name, value, low, high in (
            ("--port", cfg.port, 0, 65535), ("--ports-num", cfg.ports_num, 1, 64),
            ("--ports-num-for-sparse", cfg.ports_num_for_sparse, 0, 64),
            ("--trainers", cfg.trainers, 1, MAX_TRAINERS),
            ("--checkpoint-every", cfg.checkpoint_every, 0, None),
            ("--max-frame-mb", args.max_frame_mb, 1, MAX_FRAME_MB),
            ("--pserver-id", cfg.pserver_id, 0, None)):
        check_range(name, value, low, high, f"e.g. {name} {max(low, 1)}")
    if cfg.port + cfg.ports_num + cfg.ports_num_for_sparse > 65536:
        raise UsageError(f"port {cfg.port} plus its extra ports is past 65535",
                         "pass a lower --port")
    return cfg


def serve(cfg: ServerConfig, ready_fd: Optional[int] = None) -> int:
    """Run a pserver in this process until SIGTERM/SIGINT; return the exit code."""
    if not cfg.token:
        raise UsageError("no job token: a pserver never serves without one",
                         f"pass --token-file FILE or set {envs.JOB_TOKEN}; {envs.MAKE_TOKEN}")
    if cfg.watch_parent:
        from fluidctl.procs import lifeline
        lifeline.set_pdeathsig(signal.SIGTERM)
    server = PServer(cfg)
    try:
        server.open()
    except OSError as exc:
        raise UsageError(f"cannot listen on {cfg.host}:{cfg.port}: {exc.strerror}",
                         "pick another --port, or stop the pserver using it: "
                         f"fluidctl pserver stop --port {cfg.port}") from None
    except CheckpointError as exc:
        raise UsageError(str(exc), "pass another --checkpoint-dir or --pserver-id") from None

    from fluidctl.sigs import set_on_signals
    set_on_signals(server.stop_event, (signal.SIGTERM, signal.SIGINT))
    try:
        server.write_state(strict=True)
    except OSError as exc:
        server.close_listeners()
        from fluidctl import paths
        raise UsageError(f"cannot write the pserver state record in {paths.state_dir()}: "
                         f"{exc.strerror or exc}", "free space there, or set "
                         "FLUIDCTL_STATE_DIR to a writable directory") from None
    if ready_fd is not None:
        os.write(ready_fd, f"{server.endpoint}\n".encode())
        os.close(ready_fd)
    server.serve_forever()
    return 1 if server.final_checkpoint_failed else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s pserver %(levelname)s %(message)s")
    try:
        return serve(config_from(args, os.environ), args.ready_fd)
    except FluidctlError as exc:
        print(exc.one_line(), file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
