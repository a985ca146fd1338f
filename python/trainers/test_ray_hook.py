"""rlk.integrations.workers on a real local Ray cluster (CPU): the runtime_env's setup hook
patches verl in every worker process, so a worker's verl computes its fused head and its PPO
losses on rlk, and the driver stays unpatched."""
import os

import pytest

ray = pytest.importorskip("ray", reason="needs ray (make trainer-test installs it)")
pytest.importorskip("verl", reason="needs verl (make trainer-test installs it)")

from rlk.integrations import workers  # noqa: E402


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env=workers.runtime_env("verl"))
    yield
    ray.shutdown()


@ray.remote
def in_worker():
    import verl.utils.experimental.torch_functional as xf
    import verl.workers.utils.losses as vl
    from rlk.integrations import verl as rv
    from rlk.integrations import workers as w
    return {"pid": os.getpid(), "head": xf.FusedLinearForPPO is rv.FusedLinearForPPO,
            "agg": vl.agg_loss is rv.agg_loss, "reports": w.reports()}


def test_every_worker_is_patched(cluster):
    got = ray.get([in_worker.remote() for _ in range(6)])
    assert all(g["head"] and g["agg"] for g in got), got
    assert all(g["reports"]["verl"]["version"] == "0.9.1" for g in got)
    assert os.getpid() not in {g["pid"] for g in got}
    import verl.utils.experimental.torch_functional as xf
    from rlk.integrations import verl as rv
    assert xf.FusedLinearForPPO is not rv.FusedLinearForPPO  # the driver: not patched


def test_runtime_env_refuses_unknown():
    with pytest.raises(ValueError):
        workers.runtime_env("deepspeed")
