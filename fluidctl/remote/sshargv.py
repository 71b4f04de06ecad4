"""The OpenSSH command that reaches a node as the user's own ``ssh host`` would, and the
cipher it asks for: ``cluster sync``'s transport (``fluidctl.remote.push``) runs it.

``ssh_command`` builds the argv from what the user wrote (OpenSSH reads the same ssh config,
so Host aliases, keys, ProxyJump and known_hosts behave alike); ``with_fast_cipher`` puts
AES-GCM first where the user's ssh config leaves the cipher to OpenSSH's default and this CPU
has AES instructions. Standard library only, os alone at import: ``cluster sync``'s start-up.
"""
from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:           # annotations only: typing stays off the start-up path
    from typing import List, Optional, Sequence

# AES-GCM first: with AES-NI it is the fastest of OpenSSH's ciphers. Used only when the user's
# ssh config leaves Ciphers at OpenSSH's default (see with_fast_cipher): the same set, reordered.
CIPHERS = ("aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,"
           "aes128-ctr,aes192-ctr,aes256-ctr")
OPENSSH_DEFAULT_CIPHERS = ("chacha20-poly1305@openssh.com,aes128-ctr,aes192-ctr,aes256-ctr,"
                           "aes128-gcm@openssh.com,aes256-gcm@openssh.com")


def ssh_command(host: str, *, user: Optional[str] = None, port: Optional[int] = None,
                ssh_config: Optional[str] = None, accept_new: bool = False,
                timeout: float = 10.0, ssh: str = "ssh") -> List[str]:
    """The OpenSSH argv that reaches ``host`` as the user's own ``ssh host`` would (same config
    file, so Host aliases, keys, ProxyJump and known_hosts behave alike), never prompting."""
    argv = [ssh, "-T", "-x", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(timeout))}",
            "-o", "ServerAliveInterval=5", "-o", "LogLevel=ERROR"]
    if ssh_config:
        argv += ["-F", str(ssh_config)]
    if accept_new:
        argv += ["-o", "StrictHostKeyChecking=accept-new"]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    return argv + ["--", host]


def _aes_in_hardware() -> bool:
    """Whether this CPU has AES instructions (x86 'aes' flag, arm64 'aes' feature; Linux)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return "aes" in line.split(":", 1)[1].split()
    except OSError:
        pass
    return False


def with_fast_cipher(argvs: Sequence[List[str]]) -> List[List[str]]:
    """Each ``ssh_command`` argv, with ``-c`` putting AES-GCM first where that is safe and pays:
    this CPU has AES instructions (then AES-GCM moves data about 1.3x as fast as chacha20, the
    default's first choice) and the user's ssh config leaves Ciphers at OpenSSH's default. The
    set offered is the default's own, in another order, so a server that accepts the default
    accepts it. Where no config file ssh reads for that argv (its ``-F`` file, else
    ~/.ssh/config and /etc/ssh/ssh_config, with what they Include) has a Ciphers line, that is
    known without running anything; else ``ssh -G`` resolves it for each host (Host and Match
    blocks), all hosts at once, and any other Ciphers setting, or an ssh without ``-G``, is left
    alone. (``ssh -G`` costs two processes on the way to the first connection.)"""
    if not argvs or not _aes_in_hardware():
        return [list(argv) for argv in argvs]
    procs, may_set = [], {}             # every node's argv names the same config, usually
    for argv in argvs:
        config = argv[argv.index("-F") + 1] if "-F" in argv else None
        if config not in may_set:
            may_set[config] = config_may_set(config, "ciphers")
        if not may_set[config]:
            procs.append("default")
            continue
        import subprocess
        try:
            procs.append(subprocess.Popen(argv[:-2] + ["-G"] + argv[-2:],
                                          stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                          stderr=subprocess.DEVNULL))
        except OSError:
            procs.append(None)
    chosen = []
    for argv, proc in zip(argvs, procs):
        default = proc == "default"
        if proc is not None and not default:
            out = proc.communicate()[0]
            if proc.returncode == 0:
                for line in out.splitlines():
                    if line.startswith(b"ciphers "):
                        default = line.split()[1].decode() == OPENSSH_DEFAULT_CIPHERS
                        break
        chosen.append(argv[:-2] + ["-c", CIPHERS] + argv[-2:] if default else list(argv))
    return chosen


SYSTEM_SSH_CONFIG = "/etc/ssh/ssh_config"


def config_may_set(config: Optional[str], keyword: str) -> bool:
    """Whether any ssh config file OpenSSH reads could set ``keyword`` (lower case): the ``-F``
    file alone where one is given (ssh then skips the system file), else ~/.ssh/config and
    /etc/ssh/ssh_config, each with the files it Includes (relative to ~/.ssh, or /etc/ssh for
    the system file's, globs expanded, as ssh_config(5) says). True wherever unsure: a
    ``-F`` file or an included one that cannot be read, an Include with a quote or a
    variable, more than 16 levels of Include."""
    home_ssh = os.path.expanduser("~/.ssh")
    if config:
        tops = [(os.path.expanduser(config), home_ssh, True)]
    else:
        tops = [(os.path.join(home_ssh, "config"), home_ssh, False),
                (SYSTEM_SSH_CONFIG, os.path.dirname(SYSTEM_SSH_CONFIG), False)]

    def mentions(path: str, base: str, must_exist: bool, depth: int) -> bool:
        if depth > 16:
            return True
        try:
            with open(path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except FileNotFoundError:
            return must_exist
        except OSError:
            return True
        for line in lines:
            words = line.strip().replace("=", " ", 1).split()
            if not words or words[0].startswith("#"):
                continue
            key = words[0].lower()
            if key == keyword:
                return True
            if key != "include":
                continue
            import glob
            for pattern in words[1:]:
                if any(c in pattern for c in "\"'$%"):
                    return True
                pattern = os.path.expanduser(pattern)
                if not os.path.isabs(pattern):
                    pattern = os.path.join(base, pattern)
                for included in sorted(glob.glob(pattern)):
                    if mentions(included, base, True, depth + 1):
                        return True
        return False

    return any(mentions(path, base, must_exist, 0) for path, base, must_exist in tops)
