"""OpenRLHF's actor on the CPU with rlk's fused head (make trainer-test-openrlhf, its own venv:
OpenRLHF pins transformers 5.15.0). flash_attn cannot be installed without CUDA: where it cannot
be imported, standin/ (an import stand-in for its padding helpers, see standin/README.md) goes on
the path; the rest is OpenRLHF's own code."""
import importlib.util
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
TRAINERS = os.path.dirname(HERE)
sys.path.insert(0, TRAINERS)  # tiny.py, reference.py
sys.path.insert(0, os.path.dirname(TRAINERS))  # python/: the rlk package of this tree
if importlib.util.find_spec("flash_attn") is None:
    sys.path.insert(0, os.path.join(HERE, "standin"))
os.environ.setdefault("RLK_CACHE_DIR", tempfile.mkdtemp(prefix="rlk-trainers-cache-"))
os.environ.setdefault("RLK_TORCH_ENTRY_DIR", tempfile.mkdtemp(prefix="rlk-trainers-torch-entry-"))
