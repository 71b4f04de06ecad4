"""ElasticMembers (backends/ssh/elastic.py) where a node fails again while it comes back, and
the launcher handing out plans to an agent lost since it was chosen: in-process, with the
agents' start replaced by what start_agents returns when a node fails."""
import threading

from fluidctl.backends.ssh import diagnostics as ssh_diagnostics, elastic, launcher as ssh_launcher


class Range:
    low, high = 2, 3


def members(tmp_path, start):
    m = elastic.ElasticMembers.__new__(elastic.ElasticMembers)
    m.launcher = type("L", (), {"supervisor": object(), "hosts": ["n1", "n3"], "logged": [],
                                "log": lambda self, line: self.logged.append(line)})()
    m.range, m.lost, m.may_rejoin = Range(), {"n2": "no heartbeat"}, {"n2"}
    m.targets, m.by_name, m.standby = {"n2": object()}, {"n2": "n2"}, {}
    m._start = start
    return m


def test_a_lost_node_whose_agent_fails_to_start_again_is_tried_again_later(tmp_path,
                                                                            monkeypatch):
    """start_agents gives None for a node that failed (and has abandoned the others): the
    rejoin watch goes on (it died on None.abandon() and no lost node ever rejoined)."""
    monkeypatch.setattr(elastic, "REJOIN_EVERY", 0.01)
    monkeypatch.setattr(ssh_diagnostics, "probe_target", lambda target: "its link is up")
    stop, tries, errors = threading.Event(), [], []

    def start(hosts):
        tries.append(hosts)
        if len(tries) == 3:
            stop.set()
        return {}, [None], [("n2", "no answer from fluidctl on the node within 10s")]
    m = members(tmp_path, start)

    def watch():
        try:
            m._rejoin(stop)
        except Exception as exc:  # noqa: BLE001 - what the test looks for
            errors.append(exc)
    thread = threading.Thread(target=watch)
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and errors == [], errors
    assert len(tries) == 3 and "n2" in m.lost and m.standby == {}
    # why, in launch.log, once for as long as it stays the same
    assert m.launcher.logged == ["node n2 answers again but cannot rejoin yet: n2: no answer "
                                 "from fluidctl on the node within 10s"]


def test_the_rejoin_watch_outlives_an_error_in_one_round(tmp_path, monkeypatch):
    """Any exception in a round is logged and the next round runs: a watch thread that died
    silently would keep every lost node out for the rest of the job."""
    monkeypatch.setattr(elastic, "REJOIN_EVERY", 0.01)
    monkeypatch.setattr(ssh_diagnostics, "probe_target", lambda target: "its link is up")
    stop, tries = threading.Event(), []

    def start(hosts):
        tries.append(hosts)
        if len(tries) == 2:
            stop.set()
        raise RuntimeError("paramiko had a bad day")
    m = members(tmp_path, start)
    thread = threading.Thread(target=m._rejoin, args=(stop,))
    thread.start()
    thread.join(10)
    assert not thread.is_alive() and len(tries) == 2
    assert m.launcher.logged == ["rejoin watch: RuntimeError: paramiko had a bad day"] * 2


class LostAgent:
    """An agent whose connection closed after it was chosen (paramiko's error on send)."""
    def __init__(self):
        self.lost = ""

    def send_plan(self, share, procs):
        raise OSError("Socket is closed")

    def declare_lost(self, why):
        self.lost = why


def test_a_plan_for_an_agent_lost_since_it_was_chosen_marks_it_lost_not_a_traceback(
        monkeypatch):
    agent = LostAgent()
    launcher = ssh_launcher.SSHLauncher.__new__(ssh_launcher.SSHLauncher)
    launcher.config = type("C", (), {"max_restarts": 0, "grace_period": 1.0,
                                     "checkpoint_signal": None})()
    launcher.marker, launcher.members, launcher.agents = "m", None, [agent]
    launcher.hosts = [type("H", (), {"name": "n1"})()]
    monkeypatch.setattr(ssh_launcher, "node_share", lambda *a, **k: type("S", (), {})())
    plan = type("P", (), {"on_node": lambda self, i: ["proc"]})()
    handles = launcher.start(plan, 0)
    assert handles == [agent]
    assert agent.lost.startswith("its connection closed before it got its plan (Socket is closed")


def test_a_stopped_launcher_says_so_even_when_it_reads_the_agents_end_first():
    """SIGSTOP of the launcher for 8 s: its agents stop themselves (no beats); after SIGCONT
    paramiko may read an agent's exit before the pump's next tick. That tick still says the
    launcher itself was stopped (a clean-clone run of test_blame's 40_4 missed the line)."""
    import os
    from fluidctl.backends.ssh.agent import RemoteAgent

    class Ended:                    # a paramiko Channel whose command has exited
        closed = False
        status_event = threading.Event()
        status_event.set()

        def get_transport(self):
            return None
    logged = []
    agent = RemoteAgent.__new__(RemoteAgent)
    agent.channel, agent.host, agent.launch_log = Ended(), "node1", logged.append
    agent.beat_timeout, agent.heard, agent._woke, agent._lost = 3.0, 100.0, 100.0, ""
    agent.launcher_stopped = 0.0
    agent._ended_r, agent._ended_w = os.pipe()
    try:
        assert agent._watch_end(108.0) is False            # ended: the last tick
        assert agent.launcher_stopped == 8.0
        assert logged == ["the launcher itself was stopped for 8.0s (a gap in its own clock): "
                          "node node1's silence meanwhile is not counted against it"]
        assert os.read(agent._ended_r, 1) == b"x"
    finally:
        os.close(agent._ended_r)
