"""Job tokens for plain ``srun`` steps, without a secret made by hand.

A step that no fluidctl launcher started has no FLUIDCTL_JOB_TOKEN. Every task of it derives
the same one on its own, with no exchange: ``HMAC-SHA256(user secret, cluster/job.step)``,
where the user secret is 32 random bytes in ``paths.user_secret_file()`` (mode 0600, in the
home directory that Slurm clusters share between nodes). Another user cannot read the file,
so cannot compute the token from the (public) job and step ids; each step gets its own token.

The file is made on first use, atomically: the bytes go to a private temporary file that is
then hard-linked to the final name (link() fails when the name exists, on NFS too), so ranks
starting together all end up reading the one secret that won, never a half-written one.
A file readable by others, or owned by someone else, is refused.

Why not MUNGE: a munge credential proves a uid to whoever decodes it, but it still has to reach
the other ranks over some channel before any authenticated connection exists (a shared file,
again), and munged's socket is site-specific; the shared home is the one channel every Slurm
cluster already trusts for this user.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import stat
from typing import Mapping

from fluidctl import envs

SECRET_BYTES = 32


class SecretUnavailable(Exception):
    """(what, how to fix) for a one-line error."""


def _read(path: str) -> bytes:
    from fluidctl.paths import StateFileError, open_state_file
    try:
        fd = open_state_file(path)       # a regular file: a FIFO there would block open()
    except StateFileError as exc:
        raise SecretUnavailable(str(exc), "remove it to make a new one, or set "
                                f"{envs.JOB_TOKEN}") from None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.geteuid():
            raise SecretUnavailable(f"{path} belongs to uid {info.st_uid}, not to you",
                                    f"remove it, or set {envs.JOB_TOKEN}")
        if stat.S_IMODE(info.st_mode) & 0o077:
            raise SecretUnavailable(f"{path} is readable by others "
                                    f"(mode {stat.S_IMODE(info.st_mode):o})",
                                    f"chmod 600 {path}, or remove it to make a new one")
        data = os.read(fd, 4096)
    finally:
        os.close(fd)
    if len(data) < SECRET_BYTES:
        raise SecretUnavailable(f"{path} holds {len(data)} bytes, not a secret of "
                                f"{SECRET_BYTES}", "remove it to make a new one")
    return data


def user_secret() -> bytes:
    """The user's secret, made on first use (see the module docstring)."""
    from fluidctl.paths import user_secret_file
    path = str(user_secret_file())
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise SecretUnavailable(f"cannot read {path} ({exc.strerror})",
                                f"fix its permissions, or set {envs.JOB_TOKEN}") from None
    where = os.path.dirname(path)
    tmp = os.path.join(where, f".secret.{os.getpid()}.{os.urandom(4).hex()}")
    try:
        os.makedirs(where, mode=0o700, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.write(fd, os.urandom(SECRET_BYTES).hex().encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        try:
            os.link(tmp, path)            # fails if another rank won: read the winner's
        except FileExistsError:
            pass
        return _read(path)
    except SecretUnavailable:
        raise
    except OSError as exc:
        raise SecretUnavailable(f"cannot create the user secret {path} ({exc.strerror})",
                                f"make {where} writable, the same directory on every node "
                                f"(your home, or FLUIDCTL_STATE_DIR), or export one "
                                f"{envs.JOB_TOKEN} to every task") from None
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass


def slurm_step_token(environ: Mapping[str, str]) -> str:
    """The job token of this srun step, the same on every task of it."""
    job = environ.get(envs.SLURM_JOB_ID) or environ.get("SLURM_JOBID", "")
    step = environ.get(envs.SLURM_STEP_ID, "0")
    cluster = environ.get("SLURM_CLUSTER_NAME", "")
    message = f"fluidctl-srun-step:{cluster}/{job}.{step}".encode()
    return hmac.new(user_secret(), message, hashlib.sha256).hexdigest()[:32]
