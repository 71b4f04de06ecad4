"""A rank that idles in a C sleep: the faulthandler stack signal ends the sleep early and the
rank exits 0 (a hang whose report wakes the ranks; tests/e2e/test_hardening27.py 27.5 and
test_hang_under_load.py)."""
import ctypes
import sys

import fluidctl.runtime as rt

ctx = rt.init()
print("rank", ctx.rank, "sleeping in C", flush=True)
left = ctypes.CDLL(None).sleep(600)          # the stack signal ends it early
print("rank", ctx.rank, "woke up with", left, "s left", flush=True)
sys.exit(0)
