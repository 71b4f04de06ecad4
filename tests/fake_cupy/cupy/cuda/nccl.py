import os

import cupy

NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 6, 7, 8
NCCL_INT8, NCCL_UINT8, NCCL_INT32, NCCL_INT64 = 0, 1, 2, 4
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3


def _bytes_era():
    return int(cupy.__version__.split(".")[0]) >= 14


def get_unique_id():
    raw = os.urandom(128)
    if _bytes_era():
        return raw
    return tuple(b - 256 if b > 127 else b for b in raw)


class NcclCommunicator:
    def __init__(self, ndev, commId, rank):
        want = bytes if _bytes_era() else tuple
        if not isinstance(commId, want):
            raise TypeError(f"commId must be {want.__name__}")
        self.ndev, self.uid, self.rank = ndev, commId, rank

    def destroy(self):
        pass
