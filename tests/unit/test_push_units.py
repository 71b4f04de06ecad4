"""cluster sync's push in-process: the ssh command it builds from the user's choices, its
timeout, and which ssh configs may set a keyword."""
from fluidctl.remote import sshargv


def test_ssh_command_follows_the_user_s_choices():
    argv = sshargv.ssh_command("node1", user="bob", port=2222, ssh_config="/c", accept_new=True,
                            timeout=7)
    assert argv[0] == "ssh" and argv[-2:] == ["--", "node1"]
    joined = " ".join(argv)
    for part in ("-o BatchMode=yes", "-o ConnectTimeout=7", "-F /c",
                 "-o StrictHostKeyChecking=accept-new", "-l bob", "-p 2222"):
        assert part in joined
    assert "-F" not in sshargv.ssh_command("node1") and "-l" not in sshargv.ssh_command("node1")


def test_cluster_timeout_default_is_the_ssh_backend_s():
    from fluidctl.remote import ssh
    from fluidctl import fastargs
    from fluidctl.cluster import sync
    assert fastargs.SSH_TIMEOUT == sync.DEFAULT_TIMEOUT == ssh.DEFAULT_TIMEOUT


def test_which_configs_may_set_a_keyword(tmp_path, monkeypatch):
    """config_may_set reads the files ssh would: the -F file alone, else ~/.ssh/config and the
    system file, following Include (relative to ~/.ssh) and globs; unsure means True."""
    home = tmp_path / "home"
    (home / ".ssh" / "conf.d").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    system = tmp_path / "ssh_config"
    system.write_text("Host *\n    SendEnv LANG\n#   Ciphers aes128-ctr\n")
    monkeypatch.setattr(sshargv, "SYSTEM_SSH_CONFIG", str(system))

    def config(text):
        path = tmp_path / "c"
        path.write_text(text)
        return str(path)
    assert not sshargv.config_may_set(None, "ciphers")             # no user file, system silent
    assert not sshargv.config_may_set(config("Host a\n  HostName b\n"), "ciphers")
    assert sshargv.config_may_set(config("Host a\n  Ciphers aes256-ctr\n"), "ciphers")
    assert sshargv.config_may_set(config("Host a\n\tciphers=aes256-ctr\n"), "ciphers")
    assert sshargv.config_may_set(str(tmp_path / "missing"), "ciphers")        # ssh would fail
    (home / ".ssh" / "conf.d" / "x.conf").write_text("Match all\n  Ciphers +3des-cbc\n")
    assert sshargv.config_may_set(config("Include conf.d/*.conf\n"), "ciphers")
    assert not sshargv.config_may_set(config("Include conf.d/*.none\n"), "ciphers")
    assert sshargv.config_may_set(config('Include "conf.d/x.conf"\n'), "ciphers")  # unsure
    (home / ".ssh" / "loop").write_text("Include loop\n")
    assert sshargv.config_may_set(config("Include loop\n"), "ciphers")          # too deep
    (home / ".ssh" / "config").write_text("Include conf.d/x.conf\n")
    assert sshargv.config_may_set(None, "ciphers")                 # the user's file includes it
    system.write_text("Ciphers aes128-ctr\n")
    assert not sshargv.config_may_set(config("Host *\n"), "ciphers")    # -F: system file unread


