"""verl 0.9.1's actor path on the CPU, one process (gloo, world size 1): its ActorRolloutRefWorker
(role "actor") over the FSDP engine (engine_workers: compute_log_prob, then update_actor: one
PPO step) on the tiny Qwen2 model with use_remove_padding and use_fused_kernels, as installed or
with rlk's verl.patch() (its FusedLinearForPPO, and with --prefix the remove-padding rows' shared
prefixes). Writes to OUT (a .pt file): the log-probs and entropy compute_log_prob returned, the
update's metrics, the weights before and after, and the patch's report and prefix_calls.

verl 0.9.1 does not run on a CPU as shipped; what this harness sets up, and why:
- verl knows CUDA, ROCm and NPU platforms and falls back to CUDA; a CPU platform is registered
  through verl's own plugin seam (PlatformRegistry, set_platform): device "cpu", backend gloo,
  no memory statistics.
- its FSDP engine is registered for the devices cuda and npu only: VERL_ENGINE_DEVICE /
  VERL_ENGINE_VENDOR (verl's override of the engine lookup) pick it.
- its process-group init asks for "cpu:gloo,<device>:<backend>", which repeats cpu: the gloo
  group is made here first (verl then keeps it).
- FSDP1 refuses CPU parameters with sync_module_states (verl sets it): strategy fsdp2.
- flash-attention cannot be installed: attn_implementation sdpa.
- verl's monkey patch imports TRL's PPO value-head class when TRL is installed, which TRL 1.16
  (installed beside it here) no longer has: verl is told TRL is absent for that one check.
- with an untied LM head FSDP2 shards lm_head on its own, and the fused forward reads its weight
  without calling it (a sharded DTensor beside plain hidden states: verl's torch backend fails
  so); the model ties its head to the embedding, as Qwen2.5-0.5B does.
Everything else is verl's own code: its config (ppo_trainer.yaml), worker, engine, padding
conversions, model forward, losses and optimizer step.

    python verl_engine_run.py OUT [--rlk] [--prefix]
"""
import argparse
import contextlib
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))  # python/: the rlk package of this tree

import torch  # noqa: E402

import tiny  # noqa: E402

LR = 0.05  # SGD without weight decay or clipping: a weight moves by LR times its gradient
TEMPERATURE = 1.0


def cpu_platform():
    """verl's platform for this process's CPU (see the module's docstring)."""
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry, set_platform

    class NoDeviceStats:
        """torch.cpu, with the CUDA module's memory and device queries answered for a CPU."""

        def __getattr__(self, name):
            if hasattr(torch.cpu, name):
                return getattr(torch.cpu, name)
            if name.startswith(("memory", "max_memory")):
                return lambda *a, **k: 0
            if name in ("empty_cache", "reset_peak_memory_stats", "ipc_collect"):
                return lambda *a, **k: None
            if name == "mem_get_info":
                return lambda *a, **k: (0, 0)
            if name == "get_device_name":
                return lambda *a, **k: "CPU"
            raise AttributeError(name)

    @PlatformRegistry.register(platform="cpu")
    class PlatformCPU(PlatformBase):
        device_name = "cpu"
        vendor_name = "cpu"
        device_module = NoDeviceStats()

        def is_available(self):
            return True

        def current_device(self):
            return torch.device("cpu")

        def device_count(self):
            return 1

        def set_device(self, device_index):
            pass

        def synchronize(self, device_index=None):
            pass

        def manual_seed(self, seed):
            torch.manual_seed(seed)

        def manual_seed_all(self, seed):
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings):
            pass

        def empty_cache(self):
            pass

        def get_device_capability(self, device_index=0):
            return (None, None)

        def communication_backend_name(self):
            return "gloo"

        def visible_devices_envvar(self):
            return "CPU_VISIBLE_DEVICES"

        def nvtx_range(self, msg):
            return contextlib.nullcontext()

        def profiler_start(self):
            pass

        def profiler_stop(self):
            pass

        def ray_resource_name(self):
            return "CPU"

        def ray_noset_envvars(self):
            return []

        def is_ipc_supported(self):
            return False

        def cudart(self):
            return None

    set_platform(PlatformCPU())


def config(path):
    from hydra import compose, initialize_config_dir
    import verl
    cfgdir = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
    with initialize_config_dir(config_dir=cfgdir, version_base=None):
        cfg = compose(config_name="ppo_trainer", overrides=[
            "actor_rollout_ref.model.path=" + path,
            "actor_rollout_ref.model.use_remove_padding=True",
            "actor_rollout_ref.model.use_fused_kernels=True",
            "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.use_torch_compile=False",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.actor.use_dynamic_bsz=False",
            "actor_rollout_ref.actor.optim.optimizer=SGD",
            "actor_rollout_ref.actor.optim.lr=%g" % LR,
            "actor_rollout_ref.actor.optim.weight_decay=0.0",
            "actor_rollout_ref.actor.optim.clip_grad=1e6",
            "actor_rollout_ref.rollout.n=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
            "actor_rollout_ref.rollout.temperature=%g" % TEMPERATURE,
        ])
    return cfg


def grpo_batch():
    """2 prompts, 4 responses each (left-padded prompts, right-padded responses, lengths 1 to 6),
    an advantage per response: verl's rollout layout."""
    g = torch.Generator().manual_seed(0)
    P, R = 5, 6
    plens, rlens = [5, 3], [[6, 2, 4, 1], [3, 6, 5, 2]]
    rows = []
    for plen, lens in zip(plens, rlens):
        prompt = torch.randint(3, tiny.config().vocab_size, (plen,), generator=g)
        rows += [(prompt, torch.randint(3, tiny.config().vocab_size, (n,), generator=g)) for n in lens]
    B = len(rows)
    prompts, resp = torch.zeros(B, P, dtype=torch.long), torch.zeros(B, R, dtype=torch.long)
    pm, rm = torch.zeros_like(prompts), torch.zeros_like(resp)
    for i, (p, r) in enumerate(rows):
        prompts[i, P - len(p):], pm[i, P - len(p):] = p, 1
        resp[i, :len(r)], rm[i, :len(r)] = r, 1
    ids, am = torch.cat([prompts, resp], 1), torch.cat([pm, rm], 1)
    return {"prompts": prompts, "responses": resp, "input_ids": ids, "attention_mask": am,
            "position_ids": (am.cumsum(-1) - 1).clamp(min=0), "response_mask": rm}, \
        torch.randn(B, generator=g)


def weights(worker):
    from torch.distributed.tensor import DTensor
    return {n: (p.full_tensor() if isinstance(p, DTensor) else p).detach().float().clone()
            for n, p in worker.actor.engine.module.named_parameters()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--rlk", action="store_true", help="rlk.integrations.verl.patch()")
    ap.add_argument("--prefix", action="store_true", help="patch(prefix=True)")
    a = ap.parse_args()
    os.environ.update(VERL_ENGINE_DEVICE="cuda", VERL_ENGINE_VENDOR="nvidia", RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(29700 + os.getpid() % 200))
    cpu_platform()
    import torch.distributed as dist
    dist.init_process_group("gloo", rank=0, world_size=1)
    import verl.models.transformers.monkey_patch as mp
    mp.is_trl_available = lambda: False
    handle = None
    if a.rlk or a.prefix:
        from rlk.integrations import verl as rv
        handle = rv.patch(prefix=a.prefix)
    from verl import DataProto
    from verl.utils import tensordict_utils as tu
    from verl.workers.engine_workers import ActorRolloutRefWorker
    from verl.workers.utils.padding import left_right_2_no_padding, no_padding_2_padding
    path = tiny.saved(tempfile.mkdtemp(prefix="rlk-verl-"), tied=True,
                      **tiny.PREFIX_MODEL)
    worker = ActorRolloutRefWorker(config(path).actor_rollout_ref, role="actor")
    worker.init_model()
    tensors, adv = grpo_batch()
    batch = DataProto.from_single_dict(tensors, meta_info={"temperature": TEMPERATURE})
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=True, calculate_sum_pi_squared=False,
                         compute_loss=False)
    out = worker.compute_log_prob(td)
    log_probs = no_padding_2_padding(tu.get(out, "log_probs"), td).float()
    entropy = no_padding_2_padding(tu.get(out, "entropy"), td).float()
    before = weights(worker)
    rm = tensors["response_mask"]
    batch.batch["old_log_probs"] = log_probs
    batch.batch["advantages"] = adv[:, None].expand_as(rm) * rm
    td = left_right_2_no_padding(batch.to_tensordict())
    tu.assign_non_tensor(td, calculate_entropy=False, distillation_use_topk=False,
                         distillation_only=False, global_batch_size=8, mini_batch_size=8,
                         epochs=1, seed=1, dataloader_kwargs={"shuffle": False}, compute_loss=True)
    metrics = tu.get(worker.update_actor(td), "metrics")
    result = {"log_probs": log_probs, "entropy": entropy, "response_mask": rm,
              "metrics": {k: [float(x) for x in metrics[k]] for k in ("actor/pg_loss", "grad_norm")},
              "before": before, "after": weights(worker), "tensors": tensors}
    if handle is not None:
        from rlk.integrations import verl as rv
        result["report"] = handle.report
        result["prefix_calls"] = dict(rv.prefix_calls)
    torch.save(result, a.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
