"""Precompiled kernel trees as Python packages, one per target, that rlk finds by itself.

A cluster builds its kernels once (RLK_JIT_RECORD on a short job, then rlk-precompile into a tree
per target), wraps each tree in a wheel and installs it beside rlk:

    python -m rlk.kernel_trees build TREE --target sm_90a --out dist/
    pip install dist/rlk_kernels_sm_90a-0.1.0-py3-none-any.whl

The wheel holds the tree as package data of `rlk_kernels_<target>` and names it under the
"rlk.kernel_trees" entry point group. Before it creates its first context, rlk appends every
installed tree to RLK_CACHE_RO_DIRS (after the directories the environment already names), so a
job finds its kernels read-only: with RLK_JIT=0 it compiles nothing and writes nothing.
"""
import base64
import hashlib
import os
import platform
import re
import sys
import zipfile

GROUP = "rlk.kernel_trees"
_state = {"dirs": None}


def installed():
    """The kernel trees of the installed rlk_kernels_* packages, {target: directory}."""
    from importlib import metadata
    try:
        eps = metadata.entry_points(group=GROUP)
    except TypeError:  # Python < 3.10
        eps = metadata.entry_points().get(GROUP, [])
    found = {}
    for ep in eps:
        tree = ep.load()
        if os.path.isdir(tree):
            found[ep.name] = tree
    return found


def use_installed():
    """Appends the installed trees to RLK_CACHE_RO_DIRS once (the library reads it when a context
    is created); returns them. RLK_KERNEL_TREES=0 leaves the environment as it is."""
    if _state["dirs"] is not None:
        return _state["dirs"]
    dirs = [] if os.environ.get("RLK_KERNEL_TREES") == "0" else list(installed().values())
    if dirs:
        have = [d for d in os.environ.get("RLK_CACHE_RO_DIRS", "").split(":") if d]
        os.environ["RLK_CACHE_RO_DIRS"] = ":".join(have + [d for d in dirs if d not in have])
    _state["dirs"] = dirs
    return dirs


def _module_name(target):
    return "rlk_kernels_" + re.sub(r"[^A-Za-z0-9]", "_", target)


def _platform_tag(tree):
    """Host kernels are shared objects of their target's arch (the tree's host-<machine> folder:
    uname's machine, as the platform tag spells it; not the arch of the machine that wraps the
    tree): a manylinux wheel of that arch and of the newest glibc they reference; device code
    (cubins, code objects) runs on any host: any."""
    minors, machines = [], set()
    for root, _, files in os.walk(tree):
        # <tree>/v<schema>/<compiler>/<target>/...: a host target names its machine
        rel = os.path.relpath(root, tree).split(os.sep)
        if rel[0] in ("tmp", "quarantine"):
            continue  # staging and damaged entries, never looked up
        host = ([rel[2][len("host-"):]] if len(rel) >= 3 and re.fullmatch(r"v\d+", rel[0])
                and rel[2].startswith("host-") else [])
        for f in files:
            with open(os.path.join(root, f), "rb") as fh:
                data = fh.read()
            if data[:4] == b"\x7fELF" and (host or b"GLIBC_" in data):
                machines.update(host[:1] or [platform.machine()])
                minors += [int(m) for m in re.findall(rb"GLIBC_2\.(\d+)", data)]
    if not machines:
        return "any"
    if len(machines) > 1:
        raise ValueError("kernel tree %s: host kernels of %s; a wheel holds one target's tree"
                         % (tree, " and ".join(sorted(machines))))
    return "manylinux_2_%d_%s" % (max(minors + [17]), machines.pop())


def build_wheel(tree, target, out_dir, version=None):
    """Writes the wheel of one target's tree (a directory rlk-precompile filled) into out_dir;
    returns its path. The wheel requires the rlk that writes it (its kernels' keys hold that
    runtime's sources: another finds none of them)."""
    from . import __version__
    version = version or __version__
    if not os.path.isdir(tree):
        raise FileNotFoundError("kernel tree %s: no such directory" % tree)
    mod = _module_name(target)
    dist = mod
    tag = "py3-none-" + _platform_tag(tree)
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, "%s-%s-%s.whl" % (dist, version, tag))
    info = "%s-%s.dist-info" % (dist, version)
    files = {
        mod + "/__init__.py": (
            '"""rlk kernels precompiled for %s (python -m rlk.kernel_trees)."""\n'
            "import os\n\nTARGET = %r\nTREE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "
            '"tree")\n' % (target, target)).encode(),
        info + "/METADATA": ("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: rlk kernels "
                             "precompiled for %s\nRequires-Dist: rlk==%s\n"
                             % (dist, version, target, __version__)).encode(),
        info + "/WHEEL": ("Wheel-Version: 1.0\nGenerator: rlk.kernel_trees\nRoot-Is-Purelib: %s\n"
                          "Tag: %s\n" % ("true" if tag.endswith("any") else "false", tag)).encode(),
        info + "/entry_points.txt": ("[%s]\n%s = %s:TREE\n" % (GROUP, target, mod)).encode(),
        info + "/top_level.txt": (mod + "\n").encode(),
    }
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        def add(name, data):
            z.writestr(name, data)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            record.append("%s,sha256=%s,%d" % (name, digest, len(data)))
        for name, data in files.items():
            add(name, data)
        for root, _, names in sorted(os.walk(tree)):
            for f in sorted(names):
                full = os.path.join(root, f)
                rel = os.path.relpath(full, tree).replace(os.sep, "/")
                if rel.startswith("tmp/") or "/tmp/" in rel:
                    continue  # staging, never committed entries
                with open(full, "rb") as fh:
                    add("%s/tree/%s" % (mod, rel), fh.read())
        record.append(info + "/RECORD,,")
        z.writestr(info + "/RECORD", "\n".join(record) + "\n")
    return path


def main(argv=None):
    import argparse
    ap = argparse.ArgumentParser(prog="python -m rlk.kernel_trees", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    b = sub.add_parser("build", help="wrap one target's kernel tree in a wheel")
    b.add_argument("tree", help="the tree rlk-precompile --out wrote (one target)")
    b.add_argument("--target", required=True, help="its target: sm_90a, gfx90a, host, ...")
    b.add_argument("--out", default=".", help="the directory the wheel goes to")
    sub.add_parser("list", help="the installed trees")
    args = ap.parse_args(argv)
    if args.command == "build":
        print(build_wheel(args.tree, args.target, args.out))
    else:
        for target, tree in sorted(installed().items()):
            print("%s\t%s" % (target, tree))
    return 0


if __name__ == "__main__":
    sys.exit(main())
