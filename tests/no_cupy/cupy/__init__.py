"""Put this folder first on PYTHONPATH to run a process as if CuPy were not installed (the real
one may be: it is in the test extra for the contract tests)."""
raise ImportError("No module named 'cupy' (hidden by tests/no_cupy)")
