#!/usr/bin/env python3
"""The operator's loop for a cluster, measured: record a GRPO job's kernels, precompile them into
one read-only tree per target, wrap each tree in a wheel the package finds by itself, then start
many processes at once on the tree and check that none compiles or writes anything.

    python3 tools/cluster/kernel_tree.py --work DIR [--targets host,sm_90a] [-j N] [--procs 64]
                                         [--launch host,sm_90a] [--json FILE]

1. record: tools/cluster/grpo_job.py under RLK_JIT_RECORD (host backend) -> DIR/record.conf.
   Recorded on the host, the lines name the host's variants (variant=portable); for a GPU target
   they are made variant=auto, what a job on that GPU resolves for itself. With no host target
   (a GPU machine without the host backend's compiler) the job is recorded on the GPU.
2. precompile: rlk-precompile --targets T -j N for each target -> DIR/tree-T (seconds, kernels,
   megabytes: the goals are <= 30 s on 16 cores and <= 50 MB a target).
3. wheel: python -m rlk.kernel_trees build -> DIR/wheels/rlk_kernels_T-*.whl, installed with
   pip --target into DIR/site.
4. run: --procs processes of the job at once with RLK_JIT=0 and RLK_CACHE_MODE=ro (a production
   job's settings), each with its own empty writable cache, DIR/site on PYTHONPATH and no
   RLK_CACHE_RO_DIRS (the installed wheel is what names the tree): each reports the seconds from `import rlk` to its first launch and its compiles; after
   them every writable cache must be empty and the tree unchanged (goals: 0 compiles, 0 writes,
   <= 1 s to the first launch). --launch names the trees to run on: host, and on a machine with
   that GPU, a GPU target (the job with --device cuda).
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
JOB = os.path.join(REPO, "tools", "cluster", "grpo_job.py")
PRECOMPILE = os.path.join(REPO, "build", "bin", "rlk-precompile")
HEAD_VOCAB = "4096"  # the LM head's kernels do not depend on V: a small head runs the same ones


def env_for(**extra):
    e = dict(os.environ)
    for k in ("RLK_CACHE_RO_DIRS", "RLK_JIT", "RLK_JIT_RECORD"):
        e.pop(k, None)
    e["PYTHONPATH"] = os.path.join(REPO, "python")
    e.update(extra)
    return e


def record(work, device):
    conf = os.path.join(work, "record.conf")
    if os.path.exists(conf):
        os.remove(conf)
    subprocess.run([sys.executable, JOB, "--head-vocab", HEAD_VOCAB, "--device", device], check=True,
                   env=env_for(RLK_JIT_RECORD=conf, RLK_CACHE_DIR=os.path.join(work, "record-cache")))
    with open(conf) as f:
        return [line.strip() for line in f if line.strip()]


def for_target(lines, target):
    if target.startswith("host"):
        return lines
    return [line.replace("variant=portable", "variant=auto") for line in lines]


def tree_bytes(tree):
    total = 0
    for root, _, files in os.walk(tree):
        total += sum(os.path.getsize(os.path.join(root, f)) for f in files)
    return total


def snapshot(tree):
    out = {}
    for root, _, files in os.walk(tree):
        for f in files:
            p = os.path.join(root, f)
            st = os.stat(p)
            out[p] = (st.st_size, st.st_mtime_ns)
    return out


def precompile(work, target, lines, jobs):
    conf = os.path.join(work, "record-%s.conf" % target)
    with open(conf, "w") as f:
        f.write("\n".join(lines) + "\n")
    tree = os.path.join(work, "tree-%s" % target)
    shutil.rmtree(tree, ignore_errors=True)
    t0 = time.perf_counter()
    r = subprocess.run([PRECOMPILE, "--targets", target, "--config", conf, "--out", tree,
                        "-j", str(jobs), "--json"], capture_output=True, text=True, env=env_for())
    wall = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit("rlk-precompile for %s failed:\n%s%s" % (target, r.stdout, r.stderr))
    res = json.loads(r.stdout)
    return tree, {"target": target, "jobs": jobs, "seconds": round(wall, 2),
                  "kernels": res["kernels"], "compiled": res["compiled"],
                  "megabytes": round(tree_bytes(tree) / 1e6, 2)}


def build_and_install(work, tree, target):
    sys.path.insert(0, os.path.join(REPO, "python"))
    from rlk import kernel_trees
    wheel = kernel_trees.build_wheel(tree, target, os.path.join(work, "wheels"))
    site = os.path.join(work, "site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade",
                    "--target", site, wheel], check=True)
    return wheel, site


def run_many(work, site, procs, device):
    """procs job processes at once on the installed tree; their reports and the writes."""
    caches = [os.path.join(work, "run-cache", str(i)) for i in range(procs)]
    for c in caches:
        shutil.rmtree(c, ignore_errors=True)
        os.makedirs(c)
    base = env_for(RLK_JIT="0", RLK_CACHE_MODE="ro")
    base["PYTHONPATH"] = base["PYTHONPATH"] + os.pathsep + site
    cmd = [sys.executable, JOB, "--head-vocab", HEAD_VOCAB, "--device", device, "--json"]
    started = [subprocess.Popen(cmd,
                                env=dict(base, RLK_CACHE_DIR=c), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for c in caches]
    reports, failures = [], []
    for p in started:
        out, err = p.communicate()
        if p.returncode != 0:
            failures.append(err.strip().splitlines()[-1] if err.strip() else "exit %d" % p.returncode)
        else:
            reports.append(json.loads(out.strip().splitlines()[-1]))
    writes = sum(len(files) for c in caches for _, _, files in os.walk(c))
    return reports, failures, writes


def launch_on(work, tree, site, target, procs):
    """The job alone, then procs of it at once, on one installed tree: what they compiled and wrote."""
    device = "host" if target.startswith("host") else "cuda"
    before = snapshot(tree)
    alone, _, _ = run_many(work, site, 1, device)
    reports, failures, writes = run_many(work, site, procs, device)
    changed = snapshot(tree) != before
    firsts = [r["first_launch_s"] for r in reports]
    run = {"target": target, "alone": alone[0] if alone else None, "processes": procs,
           "ok": len(reports), "failed": failures[:5], "compiles": sum(r["compiles"] for r in reports),
           "writes": writes, "tree_changed": changed,
           "first_launch_s": {"median": round(statistics.median(firsts), 3) if firsts else None,
                              "max": round(max(firsts), 3) if firsts else None},
           "job_s_max": round(max(r["job_s"] for r in reports), 3) if reports else None}
    print("%d processes at once on the %s tree: %d ran, %d compiles, %d files written, tree %s; "
          "import to first launch median %.3f s, max %.3f s (alone: %.3f s)" % (
              procs, target, len(reports), run["compiles"], writes, "changed" if changed else "unchanged",
              run["first_launch_s"]["median"] or 0, run["first_launch_s"]["max"] or 0,
              alone[0]["first_launch_s"] if alone else 0))
    for f in failures[:5]:
        print("  failed: %s" % f)
    return run


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="a directory for the record, trees, wheels and runs")
    ap.add_argument("--targets", default="host,sm_90a")
    ap.add_argument("-j", "--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--procs", type=int, default=64)
    ap.add_argument("--launch", default="host",
                    help="the trees the processes run on: host, and a GPU target on a machine with that "
                         "GPU (the job then runs with --device cuda)")
    ap.add_argument("--json", help="also write the figures here")
    args = ap.parse_args(argv)
    launch = [t for t in args.launch.replace(",", " ").split() if t]
    targets = [t for t in args.targets.replace(",", " ").split() if t]
    missing = [t for t in launch if t not in targets]
    if missing:
        ap.error("--launch %s: not among --targets" % ",".join(missing))
    os.makedirs(args.work, exist_ok=True)
    report = {"cores": os.cpu_count(), "jobs": args.jobs, "procs": args.procs}

    # recorded on the host where a host tree is built (a GPU target's lines are then made
    # variant=auto); on the GPU otherwise (a machine with no C compiler for the host backend)
    lines = record(args.work, "host" if any(t.startswith("host") for t in targets) else "cuda")
    report["recorded"] = lines
    print("recorded %d configurations" % len(lines))
    report["trees"] = []
    built = {}
    for target in targets:
        tree, fig = precompile(args.work, target, for_target(lines, target), args.jobs)
        wheel, site = build_and_install(args.work, tree, target)
        fig["wheel"] = os.path.basename(wheel)
        fig["wheel_megabytes"] = round(os.path.getsize(wheel) / 1e6, 2)
        report["trees"].append(fig)
        print("%-8s %d kernels (%d compiled) in %.1f s with %d jobs, tree %.1f MB, wheel %s" % (
            target, fig["kernels"], fig["compiled"], fig["seconds"], args.jobs, fig["megabytes"],
            fig["wheel"]))
        built[target] = (tree, site)

    for target in launch:
        tree, site = built[target]
        report.setdefault("runs", []).append(launch_on(args.work, tree, site, target, args.procs))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    bad = [r for r in report.get("runs", [])
           if r["failed"] or r["ok"] < r["processes"] or r["compiles"] or r["writes"] or r["tree_changed"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
