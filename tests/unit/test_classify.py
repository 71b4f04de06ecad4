"""classify(): each class from recorded evidence (stacks as py-spy prints them, states, CPU,
collective counters), and the runtime's CollectiveError messages as desync or mismatch."""
from fluidctl.diagnostics.classify import Evidence, classify, classify_failure
from fluidctl.diagnostics.stacks import Frame

LIB = "/usr/lib/python3.11/site-packages"
ALLREDUCE = [Frame("Communicator.allreduce", f"{LIB}/fluidctl/runtime/collective/__init__.py", 163),
             Frame("Context.allreduce", f"{LIB}/fluidctl/runtime/__init__.py", 63),
             Frame("<module>", "/job/train.py", 30)]
BROADCAST = [Frame("Communicator._run", f"{LIB}/fluidctl/runtime/collective/__init__.py", 94),
             Frame("Communicator.broadcast", f"{LIB}/fluidctl/runtime/collective/__init__.py", 178),
             Frame("Context.broadcast", f"{LIB}/fluidctl/runtime/__init__.py", 70),
             Frame("<module>", "/job/train.py", 33)]
LOADER = [Frame("_MultiProcessingDataLoaderIter._next_data",
                f"{LIB}/torch/utils/data/dataloader.py", 1300),
          Frame("_BaseDataLoaderIter.__next__", f"{LIB}/torch/utils/data/dataloader.py", 700),
          Frame("<module>", "/job/train.py", 25)]


def waiting(rank, host="node1", count=40, frames=ALLREDUCE):
    return Evidence(rank, host, frames, state="S", cpu=0.0, count=count, running=0.0)


def test_ranks_in_different_collectives_are_a_desync():
    v = classify([waiting(0), waiting(1, "node2", frames=BROADCAST), waiting(2), waiting(3)])
    assert v.kind == "desync" and v.ranks == [1]
    assert v.sentence == ("desync: ranks 0,2,3 wait in allreduce #41 (train.py:30); rank 1 waits "
                          "in broadcast #41 (train.py:33) on node2")


def test_a_rank_one_call_behind_at_the_same_site_is_stuck_not_a_desync():
    """Rank 0 finished allreduce #40 (its last piece came), rank 1 still waits for its own:
    nobody is missing from #40, its last piece was lost on the way (a cut path)."""
    v = classify([waiting(0), waiting(1, count=39)])
    assert v.kind == "stuck" and v.ranks == [0, 1]
    assert "every rank waits in allreduce #40 (train.py:30)" in v.sentence
    assert v.sentence.endswith("; rank 0 finished its part of it and waits in #41")


def test_a_rank_two_calls_behind_or_at_another_site_is_a_desync():
    v = classify([waiting(0), waiting(1, count=38)])
    assert v.kind == "desync" and "rank 1 waits in allreduce #39 (train.py:30)" in v.sentence
    v = classify([waiting(0), waiting(1, count=39, frames=BROADCAST)])
    assert v.kind == "desync"


def test_a_rank_in_torch_dataloader_is_slow_data():
    v = classify([waiting(0), Evidence(1, "node2", LOADER, state="S", cpu=0.01, running=0.0)])
    assert v.kind == "slow data" and v.ranks == [1]
    assert v.sentence.startswith("slow data: rank 1 on node2 is in its data loader "
                                 "(_next_data at train.py:25, 1% CPU)")


def test_stopped_exited_and_unreachable_ranks():
    stopped = Evidence(1, "node2", None, "did not answer: pid 7 is stopped", state="T")
    assert classify([waiting(0), stopped]).kind == "dead peer"
    gone = Evidence(1, "node2", None, "exited with code 0", state="exited")
    v = classify([waiting(0), gone])
    assert v.sentence == ("dead peer: rank 1 on node2 has exited (exited with code 0); rank 0 "
                          "waits in allreduce #41 (train.py:30)")
    lost = Evidence(2, "node3", None, "its node (node3) did not answer")
    v = classify([waiting(0), waiting(1), lost])
    assert v.kind == "partition" and v.ranks == [2]
    assert v.sentence.startswith("partition: rank 2 on node3 cannot be reached")
    frozen = Evidence(2, "node3", None, "nothing came from its agent for 6s, yet its link is "
                      "up (...)", state="frozen")
    v = classify([waiting(0), waiting(1), frozen])
    assert v.kind == "frozen node" and v.ranks == [2]
    assert v.sentence == ("frozen node: rank 2 on node3 is alive but silent: nothing came from "
                          "its agent for 6s, yet its link is up (...); ranks 0,1 wait in "
                          "allreduce #41 (train.py:30)")


def test_a_busy_rank_on_a_crowded_machine_is_slow_compute():
    spin = [Frame("step", "/job/train.py", 12), Frame("<module>", "/job/train.py", 28)]
    v = classify([waiting(0), Evidence(1, "n", spin, state="R", cpu=0.3, running=1.0)])
    assert v.kind == "slow compute"
    assert "busy in user code (step at train.py:12, 30% CPU, runnable in 100% of samples)" \
        in v.sentence
    idle = classify([waiting(0), Evidence(1, "n", spin, state="S", cpu=0.0, running=0.0)])
    assert idle.kind == "desync" and "never reached allreduce #41" in idle.sentence


def test_everyone_in_the_same_collective_is_stuck():
    v = classify([waiting(0), waiting(1)])
    assert v.kind == "stuck" and "every rank waits in allreduce #41 (train.py:30)" in v.sentence


def test_collective_errors_are_desync_or_mismatch():
    v = classify_failure("fluidctl.runtime.collective.meta.CollectiveError",
                         "collective #2: rank 0 called allreduce but rank 1 called broadcast; "
                         "every rank must make the same collective calls in the same order",
                         "train.py:9")
    assert v.kind == "desync" and v.ranks == [0, 1] and v.sentence.endswith("(at train.py:9)")
    v = classify_failure("CollectiveError", "allreduce: dtype mismatch: rank 0 passed float32, "
                         "rank 2 passed float64")
    assert v.kind == "mismatch" and v.ranks == [0, 2]
    assert classify_failure("ValueError", "shape mismatch") is None


def test_every_rank_busy_and_none_waiting_is_not_a_hang():
    """Ranks still importing on a crowded machine, or a long silent step: nobody is stuck."""
    start = [Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
             Frame("<module>", "/job/train.py", 3)]
    v = classify([Evidence(r, "n", start, state="R", cpu=0.1, running=0.8) for r in range(3)])
    assert v.kind == "slow compute" and not v.hung
    assert v.sentence.endswith("not a hang")
    assert classify([waiting(0), Evidence(1, "n", start, state="R", cpu=0.9)]).hung


def test_a_busy_rank_whose_stack_moves_is_not_stuck():
    from fluidctl.diagnostics.classify import second_look
    spin = [Frame("step", "/job/train.py", 12), Frame("<module>", "/job/train.py", 28)]
    first = [waiting(0), Evidence(1, "n", spin, state="R", cpu=0.9, running=1.0)]
    v = classify(first)
    next_line = [Frame("step", "/job/train.py", 13)] + spin[1:]
    again = [waiting(0), Evidence(1, "n", next_line, state="R", cpu=0.9, running=1.0)]
    assert second_look(v, first, again).hung          # the same loop
    importing = [Frame("<module>", "/lib/numpy/core/__init__.py", 5)] + spin
    later = second_look(v, first, [waiting(0), Evidence(1, "n", importing, state="R", cpu=0.9)])
    assert not later.hung and later.sentence.endswith(
        "the stack of rank 1 moved between two looks: not a hang")


LOOP = [Frame("<module>", "/job/train.py", 40)]


def test_40_8_a_rank_idle_in_one_look_and_computing_in_the_next_is_not_a_desync():
    first = [Evidence(0, "n", LOOP, state="S", cpu=0.04, running=0.0),
             Evidence(1, "n", LOOP, state="R", cpu=0.3, running=1.0)]
    v = classify(first)
    assert v.hung and v.kind in ("desync", "slow compute")
    again = [Evidence(0, "n", LOOP, state="R", cpu=0.3, running=1.0),
             Evidence(1, "n", LOOP, state="R", cpu=0.3, running=1.0)]
    from fluidctl.diagnostics.classify import second_look
    assert not second_look(v, first, again).hung


def test_40_8_a_desync_seen_twice_stands_and_a_collective_completed_refutes_it():
    from fluidctl.diagnostics.classify import second_look
    idle = [Frame("sleep", "/job/train.py", 9), Frame("<module>", "/job/train.py", 40)]
    first = [waiting(0), Evidence(1, "n", idle, state="S", cpu=0.0, running=0.0, count=3)]
    v = classify(first)
    assert v.kind == "desync" and v.hung
    assert second_look(v, first, first).hung
    moved_on = [waiting(0), Evidence(1, "n", idle, state="S", cpu=0.0, running=0.0, count=4)]
    assert not second_look(v, first, moved_on).hung


def test_40_8_ranks_the_stack_signal_woke_and_ended_do_not_refute_the_hang():
    from fluidctl.diagnostics.classify import second_look
    first = [Evidence(r, "n", LOOP, state="S", cpu=0.0, running=0.0, signalled=True)
             for r in (0, 1)]
    v = classify(first)
    assert v.kind == "idle" and v.hung          # no collective at all: every rank idles
    ended = [Evidence(r, "n", None, "exited with code 0", state="exited") for r in (0, 1)]
    assert second_look(v, first, ended).hung
    unsignalled = [Evidence(r, "n", LOOP, state="S", cpu=0.0, running=0.0) for r in (0, 1)]
    assert not second_look(classify(unsignalled), unsignalled, ended).hung


def test_a_lost_node_is_frozen_or_cut_by_its_link_probe():
    from fluidctl.diagnostics.classify import lost_node
    v = lost_node("node4", "frozen: its link is up (a new TCP connection to 10.0.0.4:22 was "
                           "accepted in 0 ms) and nothing answers on it (no SSH banner within 2s)")
    assert v.kind == "frozen node" and v.sentence.startswith(
        "frozen node: node4 is alive but silent: its link is up (a new TCP connection")
    v = lost_node("node2", "a new TCP connection to 10.0.0.2:22 failed (timed out)")
    assert v.sentence == ("partition: node2 cannot be reached (a new TCP connection to "
                          "10.0.0.2:22 failed (timed out)): its link is cut or the node is down")
    assert lost_node("node3", "its link is up (...) and its sshd answers: its agent alone is "
                              "silent") is None
    assert lost_node("node3", "") is None


def test_ranks_importing_torch_are_busy_not_in_a_data_loader():
    """torch's import passes through torch.utils.data: seconds on a crowded machine, and no
    hang while every rank is still importing."""
    importing = [Frame("_find_and_load", "<frozen importlib._bootstrap>", 1176),
                 Frame("<module>", f"{LIB}/torch/utils/data/dataloader.py", 20),
                 Frame("_call_with_frames_removed", "<frozen importlib._bootstrap>", 241),
                 Frame("<module>", "/job/train.py", 7)]
    v = classify([Evidence(r, "node1", importing, state="R", cpu=0.14, running=1.0)
                  for r in range(3)])
    assert v.kind == "slow compute" and not v.hung
    assert "rank 0 in import at train.py:7" in v.sentence
    v = classify([waiting(0), Evidence(1, "node1", importing, state="R", cpu=0.9, running=1.0)])
    assert v.kind == "slow compute" and v.ranks == [1] and "(import at train.py:7" in v.sentence


def test_40_8_a_rank_that_ended_while_the_others_compute_is_not_a_hang():
    ended = Evidence(1, "n", None, "pid 7 has exited", state="exited")
    computing = Evidence(0, "n", LOOP, state="R", cpu=0.2, running=1.0)
    v = classify([computing, ended])
    assert v.kind == "dead peer" and not v.hung, v
    assert classify([waiting(0), ended]).hung           # one waits for it: a dead peer
