"""The CuPy double, read statically: fluidctl never imports it, and the gpu extra installs CuPy
with NCCL."""
import os
import pathlib

import rankspawn

ROOT = rankspawn.ROOT


def test_fluidctl_never_reaches_into_the_double():
    for path in pathlib.Path(ROOT, "fluidctl").rglob("*.py"):
        text = path.read_text()
        assert "_double" not in text and "cupy_double" not in text, path


def test_gpu_extra_installs_cupy_with_nccl():
    """2: cupy-cuda12x alone leaves cupy.cuda.nccl.available False; the extra is the pair."""
    import configparser
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"))
    extra = {line.strip() for line in cfg["options.extras_require"]["gpu"].splitlines()
             if line.strip()}
    assert extra == {"cupy-cuda12x>=13", "nvidia-nccl-cu12"}
