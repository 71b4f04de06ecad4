"""cupy.cuda.graph of the double (cupy/cuda/graph.pyx): a Graph is what a stream capture
recorded; ``launch(stream=None)`` runs it, in order, on that stream (the current one if None),
as often as it is launched; ``upload`` is accepted (nothing to upload)."""


class _Work(list):
    """Work recorded while a stream captures; ``invalid`` once an illegal call ended it."""
    invalid = False


class Graph:
    def __init__(self, work):
        self._work = list(work)

    def upload(self, stream=None):
        pass

    def launch(self, stream=None):
        from cupy import cuda
        stream = stream or cuda.get_current_stream()
        cuda.runtime._check()
        for fn in self._work:
            replay = getattr(fn, "replay", None)
            if replay is not None:             # an NCCL call: issued anew on each launch
                replay(stream)
            else:
                stream._enqueue_async(fn)
