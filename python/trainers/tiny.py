"""A tiny Qwen2-architecture causal LM with random weights and a word-level tokenizer built here
(nothing downloaded), and a prompt data set: what the trainer tests train."""
import torch
import transformers
from tokenizers import Tokenizer, models, pre_tokenizers

WORDS = ["w%d" % i for i in range(120)]
SPECIAL = ["<pad>", "<eos>", "<unk>"]


def tokenizer():
    """A whitespace word-level tokenizer over WORDS (ids 3..), <pad> 0, <eos> 1, <unk> 2."""
    vocab = {t: i for i, t in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>",
                                                eos_token="<eos>", unk_token="<unk>",
                                                padding_side="left")


# The model the prefix-sharing tests train: rlk's prefix-shared attention takes head dims 64 and
# 128. SENSITIVE on top: with weights this large and a rotary base this small a token's log-prob
# moves with the positions and the tokens it attends to by several times the bf16 rounding noise
# (at the defaults it moves by less: a layout mistake would hide in that noise).
PREFIX_MODEL = dict(head_dim=64)
SENSITIVE = dict(init=0.08, rope_theta=50.0)


def config(vocab_size=len(SPECIAL) + len(WORDS), hidden=64, layers=2, tied=False, head_dim=None,
           init=0.02, rope_theta=10000.0):
    """head_dim: hidden / 2 by default; init: the weights' standard deviation."""
    return transformers.Qwen2Config(vocab_size=vocab_size, hidden_size=hidden,
                                    intermediate_size=2 * hidden, num_hidden_layers=layers,
                                    num_attention_heads=2, num_key_value_heads=1,
                                    head_dim=head_dim or hidden // 2, tie_word_embeddings=tied,
                                    max_position_embeddings=256, bos_token_id=None,
                                    eos_token_id=1, pad_token_id=0, initializer_range=init,
                                    rope_theta=rope_theta)


def model(seed=1234, dtype=torch.float32, **kw):
    """A Qwen2ForCausalLM with random weights drawn from seed (the same weights every call)."""
    torch.manual_seed(seed)
    m = transformers.Qwen2ForCausalLM(config(**kw)).to(dtype)
    m.generation_config.eos_token_id = 1
    m.generation_config.pad_token_id = 0
    return m


def prompts(n, seed=7, length=(3, 7)):
    """n prompts of random words (a datasets.Dataset with a "prompt" column)."""
    import datasets
    g = torch.Generator().manual_seed(seed)
    rows = []
    for _ in range(n):
        k = int(torch.randint(length[0], length[1] + 1, (1,), generator=g))
        rows.append(" ".join(WORDS[int(i)] for i in torch.randint(0, len(WORDS), (k,), generator=g)))
    return datasets.Dataset.from_dict({"prompt": rows})


def saved(path, **kw):
    """The tiny model and its tokenizer saved under path (what a trainer loads by name, and
    loads again for its reference model); returns path."""
    model(**kw).save_pretrained(path)
    tokenizer().save_pretrained(path)
    return path
