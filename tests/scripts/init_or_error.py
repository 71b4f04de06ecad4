"""fluidctl.runtime.init(), printing 'ERROR <message>' for a CollectiveError (exit 0 either
way): what a rank was told when its setup failed. Used by the GPU tests."""
import fluidctl.runtime as rt
from fluidctl.runtime import CollectiveError

try:
    rt.init()
    print("OK")
except CollectiveError as exc:
    print("ERROR", exc)
