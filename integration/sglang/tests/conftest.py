"""Puts the plugin package and the import stand-ins on sys.path for these tests.

CPU: ``stubs/common`` + ``stubs/cpu`` (torchvision stand-in; see its docstring).
GPU (``VERIFY_ATTN_SGLANG_GPU=1``, set by run_gpu_tests.sh): ``stubs/common`` +
``stubs/gpu`` (sgl_kernel stand-in). Real packages installed later on the path
win over nothing: a stand-in is only found when the real package is absent,
because these folders are appended, not prepended.
"""

import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)  # integration/sglang
STUBS = os.path.join(HERE, "stubs")

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
_gpu = os.environ.get("VERIFY_ATTN_SGLANG_GPU") == "1"
for sub in ("common", "gpu" if _gpu else "cpu"):
    p = os.path.join(STUBS, sub)
    if p not in sys.path:
        sys.path.append(p)

# verify_attn itself: the installed wheel when there is one (GPU), else the
# source package (its masks module needs no compiled extension).
if importlib.util.find_spec("verify_attn") is None:
    sys.path.append(os.path.join(os.path.dirname(os.path.dirname(ROOT)), "python"))
