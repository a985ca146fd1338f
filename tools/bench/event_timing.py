"""Device-event timing of one callable for the benchmarks: untimed warm-up calls, then each call
between two CUDA events on the current stream, the host waiting for the second before the next
call. Times in milliseconds."""
import statistics

import torch


def event_times(call, warmup, iters):
    """call(i) for each i < warmup untimed, then the time of call(i) for each i < iters."""
    for i in range(warmup):
        call(i)
    torch.cuda.synchronize()
    times = []
    for i in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        call(i)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return times


def median_min_max(times):
    return statistics.median(times), min(times), max(times)


def timed(fn, warmup, iters):
    """Median, min and max time of fn() over `iters` calls after `warmup`."""
    return median_min_max(event_times(lambda _: fn(), warmup, iters))
