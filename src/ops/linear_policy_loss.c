/* linear_policy_loss.c - rlk_linear_policy_loss: the fused LM head's forward, the policy loss and
 * the head's backward in one call (include/rlk.h). The three public calls run in order on one
 * stream; this file only lays out the workspace they share and wires one's outputs into the
 * next's inputs. */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/ops.h"

/* The per-token buffers and the three calls' workspaces start at multiples of 256 bytes into the
 * caller's workspace. */
#define LPL_ALIGN ((size_t)256)
/* A stand-in workspace address for the size query (never dereferenced: the calls' size queries
 * read shapes, not data). */
#define LPL_SIZE_BASE ((uint8_t *)(uintptr_t)0x100000)

typedef struct lpl_plan {
  rlk_linear_logprob_args head;
  rlk_policy_loss_args loss;
  rlk_linear_logprob_backward_args bwd;
  size_t head_ws, loss_ws, bwd_ws; /* offsets of the three calls' workspaces */
  size_t total;
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
  const int64_t tokens = o->ndim == 2 ? o->shape[0] * o->shape[1] : o->shape[0];
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

  size_t hb = 0, lb = 0, bb = 0;
  if ((st = rlk_linear_logprob_workspace_size(ctx, &p->head, &hb))) return st;
  if ((st = rlk_policy_loss_workspace_size(ctx, &p->loss, &lb))) return st;
  if ((st = rlk_linear_logprob_backward_workspace_size(ctx, b, &bb))) return st;
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

RLK_API void rlk_linear_policy_loss_args_init(rlk_linear_policy_loss_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  rlk_linear_logprob_args_init(&args->head);
  rlk_policy_loss_args_init(&args->loss);
}

RLK_API rlk_status rlk_linear_policy_loss_workspace_size(rlk_context *ctx,
                                                         const rlk_linear_policy_loss_args *args,
                                                         size_t *bytes) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_linear_policy_loss_workspace_size: ctx is NULL");
  if (!args || !bytes)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_linear_policy_loss_workspace_size: args or bytes is NULL");
  lpl_plan p;
  rlk_status st = lpl_prepare(ctx, args, LPL_SIZE_BASE, &p);
  if (st) return st;
  *bytes = p.total;
  return RLK_OK;
}

RLK_API rlk_status rlk_linear_policy_loss(rlk_context *ctx, const rlk_linear_policy_loss_args *args,
                                          void *stream) {
  if (!ctx) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_linear_policy_loss: ctx is NULL");
  if (!args) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_linear_policy_loss: args is NULL");
  if (!args->workspace || (uintptr_t)args->workspace % 16)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "workspace: %s",
                     args->workspace ? "not 16-byte aligned" : "required (rlk_linear_policy_loss_workspace_size)");
  lpl_plan p;
  rlk_status st = lpl_prepare(ctx, args, (uint8_t *)args->workspace, &p);
  if (st) return st;
  if (args->workspace_bytes < p.total)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "workspace: %zu bytes given, rlk_linear_policy_loss_workspace_size says %zu",
                     args->workspace_bytes, p.total);
  if ((st = rlk_linear_logprob(ctx, &p.head, stream))) return st;
  if ((st = rlk_policy_loss(ctx, &p.loss, stream))) return st;
  return rlk_linear_logprob_backward(ctx, &p.bwd, stream);
}
