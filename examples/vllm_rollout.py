"""A vLLM rollout whose log-probs the trainer reproduces bit for bit (needs a CUDA GPU and vLLM
0.11.0; not run by CI, which has no GPU).

vLLM's engine decodes a batch of prompts with its sample step routed through rlk.linear_sample
(rlk.integrations.vllm, installed in the engine's worker with LLM.collective_rpc), recording each
step's rows: request id, offset, token, log-prob, kept-set threshold and the hidden state the
token was drawn from. Then:

- the engine's own outputs carry rlk's draws: every generated token and its reported log-prob
  (logprobs=0) are the recorded ones;
- the trainer scores every token with rlk.linear_logprob on the recorded hidden states and the
  head's weight, all of them in one shuffled batch: each log-prob equals the rollout's, bit for
  bit;
- with the rollout's thresholds (kept-set replay) its log-probs are over the kept sets the
  rollout drew from.

The model is a small random Qwen2-architecture one written to a temporary directory (no
tokenizer: prompts go as token ids), or --model a local Hugging Face checkpoint in bf16 whose
head vLLM serves plainly (see rlk.integrations.vllm for what the hook refuses).

    python examples/vllm_rollout.py
    python examples/vllm_rollout.py --model /path/to/Qwen2.5-0.5B-Instruct
"""
import argparse
import os
import tempfile

# the in-process engine: collective_rpc calls the hook's functions in the worker directly
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import torch  # noqa: E402
import transformers  # noqa: E402
import vllm  # noqa: E402

import rlk  # noqa: E402
from rlk.integrations import vllm as rlk_vllm  # noqa: E402


def tiny_model(path):
    torch.manual_seed(0)
    cfg = transformers.Qwen2Config(vocab_size=4096, hidden_size=256, intermediate_size=512,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   head_dim=64, max_position_embeddings=512, tie_word_embeddings=False)
    transformers.Qwen2ForCausalLM(cfg).to(torch.bfloat16).save_pretrained(path)
    return path


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="a local checkpoint (default: a tiny random Qwen2)")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    path = args.model or tiny_model(tempfile.mkdtemp(prefix="rlk-vllm-"))

    llm = vllm.LLM(model=path, dtype="bfloat16", skip_tokenizer_init=args.model is None,
                   gpu_memory_utilization=0.3, max_model_len=512, seed=0)
    report = llm.collective_rpc(rlk_vllm.install_on_worker, kwargs={"record": "hidden", "seed": 1})[0]
    print("hook installed on vLLM %s: %s" % (report["version"], report["swapped"][0]))

    V = llm.llm_engine.model_config.get_vocab_size()
    g = torch.Generator().manual_seed(2)
    prompts = [{"prompt_token_ids": torch.randint(0, V, (int(n),), generator=g).tolist()}
               for n in torch.randint(4, 24, (args.prompts,), generator=g)]
    sp = vllm.SamplingParams(temperature=args.temperature, top_k=50, top_p=0.9, max_tokens=args.tokens,
                             ignore_eos=True, logprobs=0, detokenize=False)
    outs = llm.generate(prompts, sp)
    steps = llm.collective_rpc(rlk_vllm.take_on_worker)[0]

    # the recorded rows, keyed by (request id, offset)
    rec = {}
    for s in steps:
        for j, (r, o) in enumerate(zip(s.req_ids, s.offsets)):
            rec[(r, o)] = (int(s.tokens[j]), s.logp[j], s.threshold[j], s.hidden[j])
    same_tok = same_lp = total = 0
    for out in outs:
        c = out.outputs[0]
        for o, tok in enumerate(c.token_ids):
            r_tok, r_lp, _, _ = rec[(out.request_id, o)]
            total += 1
            same_tok += tok == r_tok
            same_lp += c.logprobs[o][tok].logprob == float(r_lp)  # the engine reports rlk's value
    print("engine outputs vs the hook's record: %d/%d tokens, %d/%d log-probs equal"
          % (same_tok, total, same_lp, total))

    # the trainer: every token in one shuffled batch, from the rollout's hidden states
    keys = list(rec)
    perm = torch.randperm(len(keys), generator=g)
    rows = [rec[keys[i]] for i in perm]
    tokens = torch.tensor([r[0] for r in rows], device="cuda")
    logp = torch.stack([r[1] for r in rows]).cuda()
    thr = torch.stack([r[2] for r in rows]).cuda()
    hidden = torch.stack([r[3] for r in rows]).cuda()
    head = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16)
    weight = head.get_output_embeddings().weight.detach().cuda()
    lp = rlk.linear_logprob(hidden, weight, tokens, temperature=args.temperature)
    equal = (lp.logp.view(torch.int32) == logp.view(torch.int32)).float().mean().item()
    print("trainer rlk.linear_logprob vs rollout: %.1f%% of %d log-probs bitwise equal"
          % (100 * equal, len(rows)))
    kept = rlk.linear_logprob(hidden, weight, tokens, temperature=args.temperature, threshold=thr)
    print("kept-set replay: mean log-prob %.4f over the kept sets, %.4f over the vocabulary"
          % (kept.logp.mean().item(), lp.logp.mean().item()))


if __name__ == "__main__":
    main()
