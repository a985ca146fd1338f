"""Each CUDA kernel's mean time per call of a function (torch profiler), for the benches that
split an op's call into its kernels."""
import torch


def kernel_split(fn, calls=5):
    """[(kernel name, ms a call, launches a call)], longest first, for `calls` calls of fn back to
    back after one warm-up call."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as p:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    rows = []
    for e in sorted(p.key_averages(), key=lambda e: -e.device_time_total):
        if e.device_time_total > 0:
            rows.append((e.key.split("(")[0], e.device_time_total / calls / 1e3, e.count // calls))
    return rows
