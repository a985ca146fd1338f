/* linear_policy_loss.c - rlk_linear_policy_loss: the fused LM head's forward, the policy loss and
 * the head's backward in one call (include/rlk.h). The recompute path runs the three public calls
 * in order on one stream; the token-chunk path runs, per chunk, the stored logits
 * (linear_logprob_stored.h) and rlk_policy_loss on the chunk's tokens, then rlk_policy_loss over
 * all tokens for loss and metrics. This file lays out the workspace they share and wires one's
 * outputs into the next's inputs. */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/linear_logprob_plan.h"
#include "ops/linear_logprob_stored.h"
#include "ops/ops.h"

/* The per-token buffers and the three calls' workspaces start at multiples of 256 bytes into the
 * caller's workspace. */
#define LPL_ALIGN ((size_t)256)
/* A stand-in workspace address for the size query (never dereferenced: the calls' size queries
 * read shapes, not data). */
#define LPL_SIZE_BASE ((uint8_t *)(uintptr_t)0x100000)

/* The call's workspace at most when it chooses the token chunks' rows: the 0.3 GiB a trainer
 * budgets beside its activations. The stored logits get what the per-token buffers and the loss's
 * workspace leave (at N = 8192, V = 151936: over an overwritten grad_weight, the first 8448 of
 * u^T's lines; row-major, 1024 rows, eight whole 128-row tiles). */
#define LPL_WORKSPACE_BYTES ((int64_t)3 * ((int64_t)1 << 30) / 10)
static int64_t lpl_budget = LPL_WORKSPACE_BYTES; /* rlk_lpl_set_budget */

void rlk_lpl_set_budget(int64_t bytes) { lpl_budget = bytes > 0 ? bytes : LPL_WORKSPACE_BYTES; }

#define LPL_SCRATCH_BYTES ((1 + RLK_POLICY_LOSS_METRICS) * sizeof(float)) /* loss and metrics */
#define LPL_ROWS 64          /* chunk_tokens: a multiple of this */
/* AUTO: the token chunks from this hidden size (measured faster at 4096 on an H200; a narrower
 * head gives a chunk's dh half the multiprocessors' tiles or fewer) */
#define LPL_AUTO_MIN_H 4096

typedef struct lpl_plan {
  rlk_linear_logprob_args head;
  rlk_policy_loss_args loss;
  rlk_linear_logprob_backward_args bwd;
  size_t head_ws, loss_ws, bwd_ws; /* offsets of the three calls' workspaces */
  size_t total;
  /* the token chunks */
  int chunks;
  rlk_ll_stored stored;
  rlk_policy_loss_args chunk_loss; /* a chunk's loss: normalizers resolved, tensors set per chunk */
  rlk_policy_loss_args count;      /* the mask count before the chunks (count_pass) */
  int count_pass;
  int64_t N;
} lpl_plan;

static size_t lpl_take(size_t *off, size_t bytes) {
  const size_t at = *off;
  *off += (bytes + LPL_ALIGN - 1) / LPL_ALIGN * LPL_ALIGN;
  return at;
}

/* A contiguous f32 tensor of `like`'s shape at p. */
static rlk_tensor lpl_like(void *p, const rlk_tensor *like) {
  return like->ndim == 2 ? rlk_tensor_2d(p, RLK_F32, like->shape[0], like->shape[1], like->shape[1])
                         : rlk_tensor_1d(p, RLK_F32, like->shape[0]);
}

/* Whether a per-token tensor (or an absent one) is [B, T] with rows back to back. */
static int lpl_flat(const rlk_tensor *t) {
  return !t->data || (t->ndim == 2 && t->strides[1] == 1 && t->strides[0] == t->shape[1]);
}

/* Tokens [t0, t0 + n) of a flat per-token tensor as one padded row [1, n]; absent stays absent. */
static rlk_tensor lpl_row(const rlk_tensor *t, int64_t t0, int64_t n) {
  if (!t->data) return *t;
  return rlk_tensor_2d((char *)t->data + (size_t)t0 * rlk_dtype_size(t->dtype), t->dtype, 1, n, n);
}

/* Why the token chunks cannot take this call (NULL: they can). */
static const char *lpl_chunks_refusal(const rlk_context *ctx, const rlk_linear_policy_loss_args *a) {
  const rlk_linear_logprob_args *h = &a->head;
  const rlk_policy_loss_args *l = &a->loss;
  const char *why = NULL;
  if (!rlk_ll_stored_ok(ctx, &h->hidden, &h->weight, &why)) return why;
  if (h->variant == RLK_LINEAR_LOGPROB_TILED) return "head.variant asks for the tiled kernels";
  if (a->grad_weight.data && a->grad_weight.dtype != RLK_F32) return "grad_weight is not f32";
  if (l->mode != RLK_POLICY_PPO && l->mode != RLK_POLICY_CISPO && l->mode != RLK_POLICY_SAPO &&
      l->mode != RLK_POLICY_REINFORCE)
    return "the loss mode has a per-sequence ratio";
  if (l->agg == RLK_AGG_SEQ_MEAN_TOKEN_MEAN) return "seq-mean-token-mean weighs a token by its sequence's count";
  if (l->seq_advantages) return "per-sequence advantages";
  if (l->old_logp.ndim != 2) return "the packed layout (its sequences are device data)";
  const rlk_tensor *t[] = {&l->old_logp, &l->advantages, &l->mask, &l->ref_logp, &l->rollout_is_weights};
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++)
    if (!lpl_flat(t[i])) return "a per-token loss tensor has padding between rows";
  return NULL;
}

static rlk_status lpl_absent(const rlk_tensor *t, const char *what, const char *why) {
  if (t->data) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: must be absent (%s)", what, why);
  return RLK_OK;
}

/* Checks what the three calls do not, lays out the workspace from `base` and fills the three
 * calls' arguments; the calls check the rest. */
static rlk_status lpl_prepare(rlk_context *ctx, const rlk_linear_policy_loss_args *a, uint8_t *base,
                              lpl_plan *p) {
  rlk_status st;
  const rlk_linear_logprob_args *h = &a->head;
  const rlk_policy_loss_args *l = &a->loss;
  if ((st = lpl_absent(&h->partials, "head.partials", "no shard form"))) return st;
  if ((st = lpl_absent(&h->rows, "head.rows", "a row of hidden is a token of the loss"))) return st;
  if ((st = lpl_absent(&l->logp, "loss.logp", "the head computes it"))) return st;
  if ((st = lpl_absent(&l->entropy, "loss.entropy", "the head computes it"))) return st;
  if ((st = lpl_absent(&l->grad_logp, "loss.grad_logp", "kept in the workspace"))) return st;
  if ((st = lpl_absent(&l->grad_entropy, "loss.grad_entropy", "kept in the workspace"))) return st;
  if ((st = rlk_check_tensor(&h->hidden, "head.hidden", 1))) return st;
  if ((st = rlk_check_ndim(&h->hidden, "head.hidden", 2, 2))) return st;
  if ((st = rlk_check_tensor(&l->old_logp, "loss.old_logp", 1))) return st;
  if ((st = rlk_check_ndim(&l->old_logp, "loss.old_logp", 1, 2))) return st;
  const int64_t N = h->hidden.shape[0];
  const rlk_tensor *o = &l->old_logp;
  int64_t tokens = o->shape[0];
  if (o->ndim == 2 && __builtin_mul_overflow(o->shape[0], o->shape[1], &tokens))
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "loss.old_logp: [%lld, %lld] is more tokens than a count holds",
                     (long long)o->shape[0], (long long)o->shape[1]);
  if (tokens != N)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "loss.old_logp: %lld tokens, head.hidden has %lld rows",
                     (long long)tokens, (long long)N);
  const int entropy = l->entropy_coef != 0.0;
  const size_t row = (size_t)N * sizeof(float);

  size_t off = 0;
  p->head = *h;
  p->loss = *l;
  if (!h->logp.data) p->head.logp = rlk_tensor_1d(base + lpl_take(&off, row), RLK_F32, N);
  if (!h->lse.data) p->head.lse = rlk_tensor_1d(base + lpl_take(&off, row), RLK_F32, N);
  if (entropy && !h->entropy.data) p->head.entropy = rlk_tensor_1d(base + lpl_take(&off, row), RLK_F32, N);
  uint8_t *glp = base + lpl_take(&off, row), *gent = entropy ? base + lpl_take(&off, row) : NULL;

  /* the loss reads the head's outputs in its own layout and writes its gradients there */
  p->loss.logp = lpl_like(p->head.logp.data, o);
  p->loss.grad_logp = lpl_like(glp, o);
  if (entropy) {
    p->loss.entropy = lpl_like(p->head.entropy.data, o);
    p->loss.grad_entropy = lpl_like(gent, o);
  }

  rlk_linear_logprob_backward_args *b = &p->bwd;
  rlk_linear_logprob_backward_args_init(b);
  b->hidden = h->hidden;
  b->weight = h->weight;
  b->labels = h->labels;
  b->temperature = h->temperature;
  b->ignore_index = h->ignore_index;
  b->lse = p->head.lse;
  b->grad_logp = rlk_tensor_1d(glp, RLK_F32, N);
  if (entropy) {
    b->grad_entropy = rlk_tensor_1d(gent, RLK_F32, N);
    b->entropy = p->head.entropy;
  }
  b->grad_hidden = a->grad_hidden;
  b->grad_weight = a->grad_weight;
  b->accumulate = a->accumulate;
  b->chunk = a->chunk;
  b->group = a->group;
  b->status = h->status;
  b->threshold = h->threshold;

  size_t hb = 0, lb = 0, bb = 0;
  /* the three calls check their arguments in their size queries, whichever path runs */
  if ((st = rlk_linear_logprob_workspace_size(ctx, &p->head, &hb))) return st;
  if ((st = rlk_policy_loss_workspace_size(ctx, &p->loss, &lb))) return st;
  if ((st = rlk_linear_logprob_backward_workspace_size(ctx, b, &bb))) return st;
  if ((st = rlk_check_enum((int)a->path, "path", RLK_LPL_AUTO, RLK_LPL_TOKEN_CHUNKS, "rlk_linear_policy_loss_path")))
    return st;
  if (a->chunk_tokens < 0 || a->chunk_tokens % LPL_ROWS)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "chunk_tokens: %d is not 0 or a positive multiple of %d",
                     a->chunk_tokens, LPL_ROWS);
  p->N = N;
  p->chunks = 0;
  if (a->path != RLK_LPL_RECOMPUTE && ctx->kind != RLK_BACKEND_HOST) {
    const char *why = lpl_chunks_refusal(ctx, a);
    if (why && a->path == RLK_LPL_TOKEN_CHUNKS)
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "path: the token chunks cannot take this call (%s)", why);
    p->chunks = !why && (a->path == RLK_LPL_TOKEN_CHUNKS || h->hidden.shape[1] >= LPL_AUTO_MIN_H);
  } else if (a->path == RLK_LPL_TOKEN_CHUNKS) {
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "path: the token chunks need a GPU (sm_90a)");
  }
  if (!p->chunks) {
    p->head_ws = lpl_take(&off, hb);
    p->loss_ws = lpl_take(&off, lb);
    p->bwd_ws = lpl_take(&off, bb);
    p->total = off;
    p->head.workspace = hb ? base + p->head_ws : NULL;
    p->head.workspace_bytes = hb;
    p->loss.workspace = lb ? base + p->loss_ws : NULL;
    p->loss.workspace_bytes = lb;
    b->workspace = bb ? base + p->bwd_ws : NULL;
    b->workspace_bytes = bb;
    return RLK_OK;
  }

  /* The token chunks: rows within the stored logits' budget, chosen by the cost model unless
   * asked for. */
  const int64_t H = h->hidden.shape[1], V = h->weight.shape[0];
  const int64_t per_row = (int64_t)rlk_ll_stored_workspace(LPL_ROWS, V, 0) / LPL_ROWS;
  int64_t rows = a->chunk_tokens, ksplit = 0;
  size_t rest = off; /* what the stored logits leave: the loss's scratch and workspace */
  lpl_take(&rest, LPL_SCRATCH_BYTES);
  lpl_take(&rest, lb);
  const int64_t room = lpl_budget - (int64_t)rest;
  if (!rows && a->grad_weight.data && !a->accumulate) {
    /* every token in one chunk, u^T over the grad_weight the call overwrites: its lines from
     * ksplit there, the first ksplit in the room the records leave */
    ksplit = rlk_ll_stored_ksplit(N, H, V, room, ctx->target.multiprocessors);
    if (ksplit && rlk_ll_stored_over_weight_ok(&a->grad_weight, N, V, ksplit))
      rows = N;
    else
      ksplit = 0;
  }
  if (!rows) {
    const int64_t widest = room > 0 ? room / per_row / LPL_ROWS * LPL_ROWS : 0;
    rows = rlk_ll_token_chunk(N, H, V, a->grad_hidden.data != NULL, a->grad_weight.data != NULL,
                              ctx->target.multiprocessors, widest > LPL_ROWS ? widest : LPL_ROWS);
  }
  if (rows > N) rows = N;
  rlk_ll_stored *sd = &p->stored;
  memset(sd, 0, sizeof *sd);
  sd->hidden = h->hidden;
  sd->weight = h->weight;
  sd->labels = h->labels;
  sd->temperature = h->temperature;
  sd->ignore_index = h->ignore_index;
  sd->entropy = p->head.entropy.data != NULL;
  sd->logp = (float *)p->head.logp.data;
  sd->lse = (float *)p->head.lse.data;
  sd->ent = (float *)p->head.entropy.data;
  sd->g_lp = (const float *)glp;
  sd->g_ent = (const float *)gent;
  sd->grad_hidden = a->grad_hidden;
  sd->grad_weight = a->grad_weight;
  sd->accumulate = a->accumulate;
  sd->group = a->group;
  sd->status = (int *)h->status.data;
  sd->threshold = (const float *)h->threshold.data;
  sd->rows = rows;
  sd->ksplit = ksplit;
  sd->workspace = base + lpl_take(&off, rlk_ll_stored_workspace(rows, V, ksplit));
  /* loss [1] and the metrics of the calls whose loss is not the caller's */
  float *scratch = (float *)(base + lpl_take(&off, LPL_SCRATCH_BYTES));

  /* A chunk's loss: the same settings, its tokens as one padded row, the call's normalizers. */
  rlk_policy_loss_args *c = &p->chunk_loss;
  *c = p->loss;
  c->loss = rlk_tensor_1d(scratch, RLK_F32, 1);
  c->metrics.data = NULL;
  p->count_pass = 0;
  const int64_t B = o->shape[0];
  const int given_t = l->token_normalizer > 0.0 || l->token_normalizer_tensor.data,
            given_s = l->seq_normalizer > 0.0 || l->seq_normalizer_tensor.data;
  if (l->agg == RLK_AGG_TOKEN_MEAN && !given_t) {
    if (l->mask.data) {
      /* the mask's weight over every token, counted on the device before the chunks: the
       * loss's own pass, its metric of the mask's sum (log-probs stand-ins; no KL, no entropy) */
      p->count_pass = 1;
      rlk_policy_loss_args *n = &p->count;
      *n = p->loss;
      n->logp = o[0];
      n->entropy.data = NULL;
      n->grad_entropy.data = NULL;
      n->entropy_coef = 0.0;
      n->kl_coef = 0.0;
      n->loss = rlk_tensor_1d(scratch, RLK_F32, 1);
      n->metrics = rlk_tensor_1d(scratch + 1, RLK_F32, RLK_POLICY_LOSS_METRICS);
      c->token_normalizer_tensor = rlk_tensor_1d(scratch + 1 + RLK_PL_METRIC_MASK_SUM, RLK_F32, 1);
    } else {
      c->token_normalizer = (double)N;
    }
  }
  if ((l->agg == RLK_AGG_SEQ_MEAN_TOKEN_SUM || l->agg == RLK_AGG_SEQ_MEAN_TOKEN_SUM_NORM) && !given_s)
    c->seq_normalizer = (double)B;
  /* the largest chunk's views, for its workspace size */
  rlk_policy_loss_args v = *c;
  v.logp = lpl_row(&p->loss.logp, 0, rows);
  v.old_logp = lpl_row(&l->old_logp, 0, rows);
  v.advantages = lpl_row(&l->advantages, 0, rows);
  v.mask = lpl_row(&l->mask, 0, rows);
  v.ref_logp = lpl_row(&l->ref_logp, 0, rows);
  v.entropy = lpl_row(&p->loss.entropy, 0, rows);
  v.rollout_is_weights = lpl_row(&l->rollout_is_weights, 0, rows);
  v.grad_logp = lpl_row(&p->loss.grad_logp, 0, rows);
  v.grad_entropy = lpl_row(&p->loss.grad_entropy, 0, rows);
  size_t cb = 0, nb = 0;
  if ((st = rlk_policy_loss_workspace_size(ctx, &v, &cb))) return st;
  if (p->count_pass && (st = rlk_policy_loss_workspace_size(ctx, &p->count, &nb))) return st;
  size_t most = lb > cb ? lb : cb;
  if (nb > most) most = nb;
  p->loss_ws = lpl_take(&off, most);
  p->total = off;
  void *lw = most ? base + p->loss_ws : NULL;
  p->loss.workspace = c->workspace = p->count.workspace = lw;
  p->loss.workspace_bytes = c->workspace_bytes = p->count.workspace_bytes = most;
  return RLK_OK;
}

/* The token chunks in order, then the loss and metrics over all tokens. */
static rlk_status lpl_run_chunks(rlk_context *ctx, const lpl_plan *p, void *stream) {
  rlk_status st;
  if (p->count_pass && (st = rlk_policy_loss(ctx, &p->count, stream))) return st;
  const rlk_policy_loss_args *l = &p->loss;
  const int64_t rows = p->stored.rows;
  for (int64_t t0 = 0; t0 < p->N; t0 += rows) {
    const int64_t n = p->N - t0 < rows ? p->N - t0 : rows;
    if ((st = rlk_ll_stored_logits(ctx, &p->stored, t0, n, stream))) return st;
    rlk_policy_loss_args c = p->chunk_loss;
    c.logp = lpl_row(&l->logp, t0, n);
    c.old_logp = lpl_row(&l->old_logp, t0, n);
    c.advantages = lpl_row(&l->advantages, t0, n);
    c.mask = lpl_row(&l->mask, t0, n);
    c.ref_logp = lpl_row(&l->ref_logp, t0, n);
    c.entropy = lpl_row(&l->entropy, t0, n);
    c.rollout_is_weights = lpl_row(&l->rollout_is_weights, t0, n);
    c.grad_logp = lpl_row(&l->grad_logp, t0, n);
    c.grad_entropy = lpl_row(&l->grad_entropy, t0, n);
    if ((st = rlk_policy_loss(ctx, &c, stream))) return st;
    if ((st = rlk_ll_stored_grads(ctx, &p->stored, t0, n, t0 == 0, stream))) return st;
  }
  return rlk_policy_loss(ctx, &p->loss, stream);
}

RLK_API void rlk_linear_policy_loss_args_init(rlk_linear_policy_loss_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  rlk_linear_logprob_args_init(&args->head);
  rlk_policy_loss_args_init(&args->loss);
}

/* A call: the three calls' arguments and the token chunks. */
typedef struct lpl_call {
  rlk_op_call op;
  lpl_plan p;
} lpl_call;

/* The layout from the caller's workspace, or (the size query, a call without one) from a stand-in
 * base the checks that follow never read. */
static rlk_status lpl_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_linear_policy_loss_args *a = args;
  lpl_plan *p = &((lpl_call *)call)->p;
  uint8_t *base = a->workspace ? (uint8_t *)a->workspace : LPL_SIZE_BASE;
  rlk_status st = lpl_prepare((rlk_context *)ctx, a, base, p);
  if (!st) call->workspace = p->total;
  return st;
}

static rlk_status lpl_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  (void)args;
  const lpl_plan *p = &((lpl_call *)call)->p;
  rlk_status st;
  if (p->chunks) return lpl_run_chunks(ctx, p, stream);
  if ((st = rlk_linear_logprob(ctx, &p->head, stream))) return st;
  if ((st = rlk_policy_loss(ctx, &p->loss, stream))) return st;
  return rlk_linear_logprob_backward(ctx, &p->bwd, stream);
}

/* What the sub-calls cannot see: grad_weight and grad_hidden (written from the first kernel of the
 * token chunks on) against the loss's inputs, and everything against the workspace. */
static const rlk_arg_field lpl_fields[] = {
    RLK_ARG_IN(rlk_linear_policy_loss_args, head.hidden),
    RLK_ARG_IN(rlk_linear_policy_loss_args, head.weight),
    RLK_ARG_IN(rlk_linear_policy_loss_args, head.labels),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, head.logp),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, head.lse),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, head.entropy),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, head.status),
    RLK_ARG_IN(rlk_linear_policy_loss_args, head.threshold),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.old_logp),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.advantages),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.mask),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.seq_offsets),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.ref_logp),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.rollout_is_weights),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.token_normalizer_tensor),
    RLK_ARG_IN(rlk_linear_policy_loss_args, loss.seq_normalizer_tensor),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, loss.loss),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, loss.metrics),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, grad_hidden),
    RLK_ARG_OUT(rlk_linear_policy_loss_args, grad_weight)};

/* No configuration line of its own: the three calls it makes record theirs. */
static const rlk_op_entry lpl_entry = {
    .name = "rlk_linear_policy_loss", .call_size = sizeof(lpl_call), RLK_OP_FIELDS(lpl_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_linear_policy_loss_args, 16), .validate = lpl_validate, .launch = lpl_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_linear_policy_loss, rlk_linear_policy_loss_args, lpl_entry)
