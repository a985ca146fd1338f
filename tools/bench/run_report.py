"""What the benchmarks' JSON reports share: the tree's revision and writing the report."""
import json
import os
import subprocess

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def git_revision():
    """The short commit of this tree, or None when git cannot tell."""
    try:
        return subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or None
    except Exception:
        return None


def write_json(path, doc):
    """Writes doc to path (indented JSON); nothing when path is None."""
    if path:
        with open(path, "w") as f:
            json.dump(doc, f, indent=1)
