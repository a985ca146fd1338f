"""Import stand-in for flash-attention on machines without CUDA (see ../README.md): the padding
helpers OpenRLHF's Actor imports, nothing else."""
