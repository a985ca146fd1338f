"""rlk patched into every worker process of a Ray-based trainer (verl, OpenRLHF): a patch() in
the driver does not reach the workers, which are separate processes. Ray runs
`worker_process_setup_hook` in each worker as it starts:

    from rlk.integrations import workers
    ray.init(runtime_env=workers.runtime_env("verl"))       # every worker runs rlk's verl.patch()

runtime_env(*trainers, force=False) returns that runtime_env (merged into `base`, if given);
setup() is the hook: it patches the trainers named in RLK_PATCH ("verl,trl,openrlhf") and keeps
the handles (reports() gives their reports, e.g. from a remote task).
"""
import os

import rlk

__all__ = ["runtime_env", "setup", "reports"]

HOOK = __name__ + ".setup"
_handles = {}


def runtime_env(*trainers, force=False, base=None):
    """A Ray runtime_env whose worker_process_setup_hook patches `trainers` (names of
    rlk.integrations modules with a patch(): "verl", "trl", "openrlhf") in every worker; the
    workers import this rlk (its directory joins PYTHONPATH)."""
    for t in trainers:
        if t not in ("verl", "trl", "openrlhf"):
            raise ValueError("runtime_env: %r is not 'verl', 'trl' or 'openrlhf'" % (t,))
    env = dict(base or {})
    env_vars = dict(env.get("env_vars", {}))
    env_vars["RLK_PATCH"] = ",".join(trainers)
    env_vars["RLK_PATCH_FORCE"] = "1" if force else "0"
    here = os.path.dirname(os.path.dirname(os.path.abspath(rlk.__file__)))
    path = env_vars.get("PYTHONPATH", os.environ.get("PYTHONPATH", ""))
    env_vars["PYTHONPATH"] = here if not path else here + os.pathsep + path
    if os.environ.get("RLK_LIBRARY"):
        env_vars.setdefault("RLK_LIBRARY", os.environ["RLK_LIBRARY"])
    env["env_vars"] = env_vars
    env["worker_process_setup_hook"] = HOOK
    return env


def setup():
    """Ray's worker_process_setup_hook: patch() of each trainer in RLK_PATCH (once a process)."""
    import importlib
    force = os.environ.get("RLK_PATCH_FORCE") == "1"
    for t in filter(None, os.environ.get("RLK_PATCH", "").split(",")):
        if t not in _handles:
            _handles[t] = importlib.import_module("rlk.integrations." + t).patch(force=force)


def reports():
    """{trainer: its patch's report} in this process."""
    return {t: h.report for t, h in _handles.items()}
