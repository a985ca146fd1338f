"""Fair same-run timing of several implementations: rounds, each timing every function once in a
rotated order (no implementation always runs first, right after another's heat), each call
event-timed with the device kept busy while the host queues it (a training step's host runs
ahead of the device; the host's per-call time is not what is compared). Returns each function's
list of times, ms."""
import torch


def rotated_rounds(fns, rounds, warmup=2, busy_cycles=2_000_000):
    for fn in fns:
        for _ in range(warmup):
            fn()
    torch.cuda.synchronize()
    times = [[] for _ in fns]
    for r in range(rounds):
        for j in range(len(fns)):
            i = (r + j) % len(fns)
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(busy_cycles)  # about a millisecond of device work
            a.record()
            fns[i]()
            b.record()
            b.synchronize()
            times[i].append(a.elapsed_time(b))
    return times


def median(ts):
    s = sorted(ts)
    return s[len(s) // 2]
