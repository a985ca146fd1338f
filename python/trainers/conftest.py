"""The trainers running on the CPU with rlk patched in (TRL's GRPOTrainer, verl's fused head,
OpenRLHF's actor, a Ray cluster), against the same trainers as installed. Run by `make
trainer-test`, which installs the pinned trainers and what they need into TRAINER_VENV
(requirements.txt)."""
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # python/: the rlk package of this tree
os.environ.setdefault("RLK_CACHE_DIR", tempfile.mkdtemp(prefix="rlk-trainers-cache-"))
os.environ.setdefault("RLK_TORCH_ENTRY_DIR", tempfile.mkdtemp(prefix="rlk-trainers-torch-entry-"))
