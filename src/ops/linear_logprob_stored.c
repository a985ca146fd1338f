/* linear_logprob_stored.c - rlk_linear_policy_loss's token chunks on sm_90a
 * (linear_logprob_stored.h): their workspace and its layouts, the u -> dz kernels' templates, and
 * the launches of a chunk's logits and gradients on the backward's sm_90a kernel and the forward's
 * combine. */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "ops/linear_logprob_bwd.h"
#include "ops/linear_logprob_fwd.h"
#include "ops/linear_logprob_op.h"
#include "ops/linear_logprob_stored.h"
#include "ops/ops.h"
#include "runtime/record.h"
#include "common/linear_logprob_params.h"

/* The kernels' arguments (templates/common/linear_logprob_params.h). */
RLK_PARAMS_DECLARE(ll_stored_dz_args, RLK_LL_STORED_DZ_PARAMS, RLK_LL_STORED_DZ_PARAMS_SIZE);

#define LL_N(a) (sizeof(a) / sizeof((a)[0]))

/* the token chunks' u -> dz (templates/cuda/linear_logprob_stored.cuh) */
static const rlk_value_decl *const ll_stored_dz_params[] = {
    RLK_PARAM_CHOICE("hidden", rlk_ll_dt_names, 1, 2),
    &rlk_ll_labels,
    &rlk_ll_entropy,
};
const rlk_template rlk_ll_stored_dz_tmpl = {"linear_logprob", "linear_logprob_stored_dz",
                                            "cuda/linear_logprob_stored.cuh", NULL, LL_N(ll_stored_dz_params),
                                            ll_stored_dz_params};
/* ... and over u^T (the stored logits over grad_weight) */
const rlk_template rlk_ll_stored_dz_t_tmpl = {"linear_logprob", "linear_logprob_stored_dz_t",
                                              "cuda/linear_logprob_stored.cuh", NULL, LL_N(ll_stored_dz_params),
                                              ll_stored_dz_params};
#define LL_STORED_PITCH 64 /* u's row pitch: V rounded up to this (128-byte rows for TMA) */
#define LL_STORED_MAX_GRID_Y 65535 /* a launch's grid.y at most (CUDA's limit) */

int rlk_ll_stored_ok(const rlk_context *ctx, const rlk_tensor *hidden, const rlk_tensor *weight, const char **why) {
  if (!rlk_ll_wgmma_target(ctx)) {
    *why = "needs an sm_90a target";
    return 0;
  }
  int64_t N, H, V, hs, ws, wH;
  if (rlk_ll_check_matrix(hidden, "hidden", &N, &H, &hs) || rlk_ll_check_matrix(weight, "weight", &V, &wH, &ws)) {
    rlk_error_clear();
    *why = "hidden or weight is no matrix the kernels take";
    return 0;
  }
  const rlk_tma_desc_request r[4] = {rlk_ll_tma_req(hidden->data, hidden->dtype, N, H, hs, LL_SM90_BM),
                                     rlk_ll_tma_req(hidden->data, hidden->dtype, N, H, hs, 64),
                                     rlk_ll_tma_req(weight->data, weight->dtype, V, H, ws, LL_SM90_BN),
                                     rlk_ll_tma_req(weight->data, weight->dtype, V, H, ws, 64)};
  for (int i = 0; i < 4; i++)
    if (rlk_tma_check(&r[i]) != RLK_OK) {
      rlk_error_clear();
      *why = i < 2 ? "no tensor map for hidden" : "no tensor map for weight";
      return 0;
    }
  return 1;
}

static int64_t ll_stored_pitch(int64_t V) { return (V + LL_STORED_PITCH - 1) / LL_STORED_PITCH * LL_STORED_PITCH; }

/* u's bytes in the workspace: rows x V, or (ksplit > 0) the lines [0, min(ksplit, V)) of u^T */
static size_t ll_stored_u_bytes(int64_t rows, int64_t V, int64_t ksplit) {
  return rlk_ll_align256(ksplit ? (size_t)((ksplit < V ? ksplit : V) * ll_stored_pitch(rows) * 2)
                                : (size_t)(rows * ll_stored_pitch(V) * 2));
}

size_t rlk_ll_stored_workspace(int64_t rows, int64_t V, int64_t ksplit) {
  const int64_t tiles = (V + RLK_LL_STORED_TILE - 1) / RLK_LL_STORED_TILE;
  return ll_stored_u_bytes(rows, V, ksplit) + rlk_ll_align256((size_t)(tiles * rows) * RLK_LL_RECORD_BYTES);
}

/* The rounds of persistent blocks grad_weight's slices of ks lines take (each slice a launch
 * of 128 x 256 tiles over `sms` blocks). */
static int64_t ll_slice_rounds(int64_t V, int64_t H, int64_t ks, int64_t sms) {
  const int64_t tn = (H + LL_SM90_BN - 1) / LL_SM90_BN;
  int64_t rounds = 0;
  for (int64_t v0 = 0; v0 < V; v0 += ks) {
    const int64_t lines = V - v0 < ks ? V - v0 : ks, tiles = (lines + LL_SM90_BM - 1) / LL_SM90_BM * tn;
    rounds += (tiles + sms - 1) / sms;
  }
  return rounds;
}

int64_t rlk_ll_stored_ksplit(int64_t N, int64_t H, int64_t V, int64_t room, int sms) {
  const int64_t line = ll_stored_pitch(N) * 2, most = (V + RLK_LL_STORED_TILE - 1) / RLK_LL_STORED_TILE * RLK_LL_STORED_TILE;
  const int64_t records = (int64_t)(rlk_ll_stored_workspace(N, V, 0) - ll_stored_u_bytes(N, V, 0));
  const int64_t left = room - records;
  int64_t k = left > 0 ? left / line / RLK_LL_STORED_TILE * RLK_LL_STORED_TILE : 0;
  if (k > most) k = most;
  if (k < most && sms > 0) {
    /* the fewest rounds among the sizes down to half: a slice's last round of tiles, part of the
     * blocks busy, is paid once a launch */
    int64_t best = k, least = ll_slice_rounds(V, H, k, sms);
    for (int64_t c = k - RLK_LL_STORED_TILE; c >= k / 2 && c > 0; c -= RLK_LL_STORED_TILE) {
      const int64_t r = ll_slice_rounds(V, H, c, sms);
      if (r < least) best = c, least = r;
    }
    k = best;
  }
  return k;
}

int rlk_ll_stored_over_weight_ok(const rlk_tensor *grad_weight, int64_t N, int64_t V, int64_t ksplit) {
  if (!grad_weight->data || grad_weight->dtype != RLK_F32 || grad_weight->ndim != 2 || ksplit <= 0 ||
      ksplit % RLK_LL_STORED_TILE)
    return 0;
  const int64_t gws = grad_weight->strides[0];
  if (grad_weight->strides[1] != 1 || gws % 4 || (uintptr_t)grad_weight->data % 16) return 0;
  /* u^T's 64-column blocks are the transposed pass's grid.y: 65535 at most */
  if (V > LL_STORED_MAX_GRID_Y * (int64_t)RLK_LL_STORED_T_COLS) return 0;
  if (ksplit >= V) return 1; /* all of u^T in the workspace */
  /* a line of u^T (N 16-bit values) within a row's own H values, never in the padding between
   * rows, which may be another tensor's */
  if (N > 2 * grad_weight->shape[1]) return 0;
  const rlk_tma_desc_request r = rlk_ll_tma_req(grad_weight->data, RLK_BF16, V - ksplit, N, 2 * gws, 64);
  return rlk_ll_tma_ok(&r);
}

/* The chunk's pieces: u (u^T's two parts when transposed), the records, and hidden / labels from
 * row r0. */
typedef struct ll_stored_chunk {
  int64_t N, H, V, hs, ws, ls, pitch, gws;
  void *u, *u2, *records; /* u2: u^T's lines from ksplit, 16-bit in grad_weight's memory */
  const void *hidden, *labels;
} ll_stored_chunk;

static void ll_stored_chunk_of(const rlk_ll_stored *s, int64_t r0, ll_stored_chunk *c) {
  int64_t wH;
  rlk_ll_check_matrix(&s->hidden, "hidden", &c->N, &c->H, &c->hs); /* checked by rlk_ll_stored_ok */
  rlk_ll_check_matrix(&s->weight, "weight", &c->V, &wH, &c->ws);
  c->ls = s->labels.ndim == 1 ? s->labels.strides[0] : 1;
  c->pitch = ll_stored_pitch(s->ksplit ? s->rows : c->V);
  c->gws = s->grad_weight.data ? s->grad_weight.strides[0] : 0;
  c->u = s->workspace;
  c->u2 = s->grad_weight.data;
  c->records = (char *)s->workspace + ll_stored_u_bytes(s->rows, c->V, s->ksplit);
  c->hidden = (const char *)s->hidden.data + (size_t)(r0 * c->hs) * 2u;
  c->labels = (const char *)s->labels.data + (size_t)(r0 * c->ls) * rlk_dtype_size(s->labels.dtype);
}

/* The maps of u: row-major [n][V] (64 x 64 boxes) into m_u; or, transposed, u^T's lines [0, ksplit)
 * in the workspace into m_u and [ksplit, V) in grad_weight into m_u2 (m_u again where u^T has no
 * such lines), boxes of box_lines lines x 64 rows. */
static rlk_status ll_stored_u_maps(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                                   uint32_t box_lines, rlk_tensor_map *m_u, rlk_tensor_map *m_u2) {
  const rlk_dtype dt = s->hidden.dtype;
  rlk_status st;
  if (!s->ksplit) {
    const rlk_tma_desc_request r = rlk_ll_tma_req(c->u, dt, n, c->V, c->pitch, 64);
    if ((st = rlk_context_tensor_map(ctx, &r, m_u))) return st;
    *m_u2 = *m_u;
    return RLK_OK;
  }
  const int64_t lo = s->ksplit < c->V ? s->ksplit : c->V;
  const rlk_tma_desc_request r = rlk_ll_tma_req(c->u, dt, lo, n, c->pitch, box_lines);
  if ((st = rlk_context_tensor_map(ctx, &r, m_u))) return st;
  if (lo == c->V) {
    *m_u2 = *m_u;
    return RLK_OK;
  }
  const rlk_tma_desc_request r2 = rlk_ll_tma_req(c->u2, dt, c->V - lo, n, 2 * c->gws, box_lines);
  return rlk_context_tensor_map(ctx, &r2, m_u2);
}

rlk_status rlk_ll_stored_logits(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, void *stream) {
  ll_stored_chunk c;
  ll_stored_chunk_of(s, r0, &c);
  if (r0 == 0 && rlk_record_enabled()) {
    rlk_op_values line;
    rlk_op_values_init(&rlk_op_linear_logprob, &line);
    rlk_ll_line(&line, 3, s->hidden.dtype, s->labels.dtype, s->entropy,
                s->grad_hidden.data && s->grad_hidden.dtype != RLK_F32, RLK_LINEAR_LOGPROB_AUTO, 0);
    rlk_record_op(&rlk_op_linear_logprob, &line);
  }
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int tr = s->ksplit > 0;
  const rlk_kernel_spec lg = {&rlk_ll_bwd_sm90_tmpl,
                              {tr ? RLK_LL_BWD_LOGITS_T : RLK_LL_BWD_LOGITS, hd, s->labels.dtype, s->entropy, 0}},
                        cb = {&rlk_ll_combine_tmpl, {s->labels.dtype, s->entropy}};
  rlk_status st;
  if ((st = rlk_spec_validate(&lg)) || (st = rlk_spec_validate(&cb))) return st;
  ll_bwd_sm90_args g = {0};
  const rlk_tma_desc_request r_h = rlk_ll_tma_req(c.hidden, dt, n, c.H, c.hs, LL_SM90_BM),
                             r_w = rlk_ll_tma_req(s->weight.data, dt, c.V, c.H, c.ws, LL_SM90_BN);
  if ((st = rlk_context_tensor_map(ctx, &r_h, &g.map_a)) || (st = rlk_context_tensor_map(ctx, &r_w, &g.map_b)) ||
      (st = ll_stored_u_maps(ctx, s, &c, n, 64, &g.map_c, &g.map_d)))
    return st;
  g.labels = c.labels, g.label_stride = c.ls, g.V = c.V, g.ignore_index = s->ignore_index;
  g.temperature = s->temperature, g.group = s->group ? s->group : RLK_LL_BWD_GROUP;
  g.M = n, g.Nn = c.V, g.K = c.H, g.out = c.u, g.out_stride = c.pitch, g.out_aux = c.records, g.ksplit = s->ksplit;
  g.threshold = s->threshold ? s->threshold + r0 : NULL;
  if ((st = rlk_ll_bwd_sm90_launch(ctx, &lg, &g, LL_BWD_SM90_SMEM_STAGED, stream))) return st;
  return rlk_ll_combine(ctx, &cb, c.records, g.tiles_n, n, c.V, c.labels, c.ls, s->ignore_index, s->logp + r0,
                        s->lse + r0, s->entropy ? s->ent + r0 : NULL, s->status, NULL, 0, s->temperature, NULL, 0,
                        s->threshold ? s->threshold + r0 : NULL, stream);
}

/* u -> dz in place: the row-major pass over the chunk's rows, or the transposed one over u^T's
 * two parts. The row-major pass's grid holds a row in grid.y, so a chunk of more rows than CUDA's
 * 65535 there goes in slices (the records keep the chunk's row count as their stride); u^T's
 * column blocks are never more (rlk_ll_stored_over_weight_ok). */
static rlk_status ll_stored_dz(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t r0,
                               int64_t n, void *stream) {
  const int hd = s->hidden.dtype == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const rlk_kernel_spec fx = {s->ksplit ? &rlk_ll_stored_dz_t_tmpl : &rlk_ll_stored_dz_tmpl,
                              {hd, s->labels.dtype, s->entropy}};
  rlk_status st;
  if ((st = rlk_spec_validate(&fx))) return st;
  const int64_t per_block = LL_THREADS * RLK_LL_STORED_VEC * RLK_LL_STORED_VECS;
  const int64_t slice = s->ksplit ? n : LL_STORED_MAX_GRID_Y;
  const size_t label_bytes = rlk_dtype_size(s->labels.dtype);
  for (int64_t a = 0; a < n; a += slice) {
    const int64_t m = n - a < slice ? n - a : slice, ra = r0 + a;
    ll_stored_dz_args z = {0};
    z.u = (char *)c->u + (size_t)(a * c->pitch) * 2u;
    z.u_stride = c->pitch;
    z.u2 = c->u2;
    z.u2_stride = 2 * c->gws;
    z.ksplit = s->ksplit;
    z.partials = (const char *)c->records + (size_t)a * RLK_LL_RECORD_BYTES;
    z.M = n; /* the records' stride; the row-major pass's rows are grid.y's */
    z.V = c->V;
    z.labels = (const char *)c->labels + (size_t)(a * c->ls) * label_bytes;
    z.label_stride = c->ls;
    z.ignore_index = s->ignore_index;
    z.lse = s->lse + ra;
    z.g_lp = s->g_lp + ra;
    z.entropy = s->entropy ? s->ent + ra : NULL;
    z.g_ent = s->entropy && s->g_ent ? s->g_ent + ra : NULL;
    z.temperature = s->temperature;
    z.threshold = s->threshold ? s->threshold + ra : NULL;
    const rlk_launch_dims d =
        s->ksplit ? rlk_op_grid((uint64_t)((n + RLK_LL_STORED_T_ROWS - 1) / RLK_LL_STORED_T_ROWS),
                                (uint64_t)((c->V + RLK_LL_STORED_T_COLS - 1) / RLK_LL_STORED_T_COLS), 1, LL_THREADS, 0)
                  : rlk_op_grid((uint64_t)((c->V + per_block - 1) / per_block), (uint64_t)m, 1, LL_THREADS, 0);
    if ((st = rlk_context_launch_params(ctx, &fx, &d, stream, &z))) return st;
  }
  return RLK_OK;
}

/* dh = dz W over the whole vocabulary into the chunk's rows of grad_hidden, each element written
 * once: A = dz K-major (row-major u), or MN-major from u^T's two parts (the dh_t kind). */
static rlk_status ll_stored_dh(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t r0,
                               int64_t n, ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype, gd = s->grad_hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int64_t ghs = s->grad_hidden.strides[0];
  void *gh = (char *)s->grad_hidden.data + (size_t)(r0 * ghs) * rlk_dtype_size(gd);
  const rlk_kernel_spec dh = {&rlk_ll_bwd_sm90_tmpl,
                              {s->ksplit ? RLK_LL_BWD_DH_T : RLK_LL_BWD_DH, hd, RLK_I32, 0, rlk_op_float_dt(gd)}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dh))) return st;
  const rlk_tma_desc_request r_b = rlk_ll_tma_req(s->weight.data, dt, c->V, c->H, c->ws, 64),
                             r_c = gd == RLK_F32 ? rlk_ll_tma_req_f32(gh, n, c->H, ghs)
                                                 : rlk_ll_tma_req(gh, gd, n, c->H, ghs, 64);
  /* a 16-bit grad_hidden that is added to keeps the register path */
  g->staged = (gd == RLK_F32 || !s->accumulate) && rlk_ll_tma_ok(&r_c);
  if (s->ksplit) {
    st = ll_stored_u_maps(ctx, s, c, n, 64, &g->map_a, &g->map_d);
  } else {
    const rlk_tma_desc_request r_a = rlk_ll_tma_req(c->u, dt, n, c->V, c->pitch, LL_SM90_BM);
    if (!(st = rlk_context_tensor_map(ctx, &r_a, &g->map_a))) g->map_d = g->map_a;
  }
  g->map_c = g->map_a;
  if (st || (st = rlk_context_tensor_map(ctx, &r_b, &g->map_b)) ||
      (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))))
    return st;
  g->M = n, g->Nn = c->H, g->K = c->V, g->c0 = 0, g->ksplit = s->ksplit, g->out = gh, g->out_stride = ghs;
  g->accumulate = s->accumulate;
  return rlk_ll_bwd_sm90_launch(ctx, &dh, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream);
}

/* grad_weight from row-major chunks: dz^T h over the chunk's rows, added to the chunks before it
 * (first: the first chunk, which writes unless accumulating). */
static rlk_status ll_stored_dw(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                               int first, ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const rlk_kernel_spec dw = {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DW, hd, RLK_I32, 0, 0}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dw))) return st;
  const rlk_tma_desc_request r_a = rlk_ll_tma_req(c->u, dt, n, c->V, c->pitch, 64),
                             r_b = rlk_ll_tma_req(c->hidden, dt, n, c->H, c->hs, 64),
                             r_c = rlk_ll_tma_req_f32(s->grad_weight.data, c->V, c->H, c->gws);
  g->staged = rlk_ll_tma_ok(&r_c);
  if ((st = rlk_context_tensor_map(ctx, &r_a, &g->map_a)) || (st = rlk_context_tensor_map(ctx, &r_b, &g->map_b)))
    return st;
  g->map_c = g->map_d = g->map_a;
  if (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))) return st;
  g->M = c->V, g->Nn = c->H, g->K = n, g->c0 = 0, g->ksplit = 0, g->out = s->grad_weight.data, g->out_stride = c->gws;
  g->accumulate = !first || s->accumulate;
  return rlk_ll_bwd_sm90_launch(ctx, &dw, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream);
}

/* grad_weight over u^T, in slices of ksplit lines from the last: slice j (lines [j ksplit,
 * (j + 1) ksplit)) reads dz^T's lines from the workspace (j = 0) or from grad_weight's rows
 * [(j - 1) ksplit, j ksplit), and writes grad_weight's rows [j ksplit, ...), which held slice
 * j + 1's, read by the launch before. Each slice is a dh-kind product (A = its dz^T lines,
 * K-major over the rows; B = h), written once: this layout needs an overwritten grad_weight. */
static rlk_status ll_stored_dw_slices(rlk_context *ctx, const rlk_ll_stored *s, const ll_stored_chunk *c, int64_t n,
                                      ll_bwd_sm90_args *g, void *stream) {
  const rlk_dtype dt = s->hidden.dtype;
  const int hd = dt == RLK_F16 ? RLK_DT_F16 : RLK_DT_BF16;
  const int64_t ks = s->ksplit, V = c->V;
  const rlk_kernel_spec dw = {&rlk_ll_bwd_sm90_tmpl, {RLK_LL_BWD_DH, hd, RLK_I32, 0, 0}};
  rlk_status st;
  if ((st = rlk_spec_validate(&dw))) return st;
  const rlk_tma_desc_request r_b = rlk_ll_tma_req(c->hidden, dt, n, c->H, c->hs, 64);
  if ((st = rlk_context_tensor_map(ctx, &r_b, &g->map_b))) return st;
  for (int64_t j = (V + ks - 1) / ks - 1; j >= 0; j--) {
    const int64_t v0 = j * ks, lines = V - v0 < ks ? V - v0 : ks;
    const void *src = j == 0 ? c->u : (const char *)c->u2 + (size_t)((j - 1) * ks * c->gws) * 4u;
    float *out = (float *)s->grad_weight.data + v0 * c->gws;
    const rlk_tma_desc_request r_a = rlk_ll_tma_req(src, dt, lines, n, j == 0 ? c->pitch : 2 * c->gws, LL_SM90_BM),
                               r_c = rlk_ll_tma_req_f32(out, lines, c->H, c->gws);
    g->staged = rlk_ll_tma_ok(&r_c);
    if ((st = rlk_context_tensor_map(ctx, &r_a, &g->map_a))) return st;
    g->map_c = g->map_d = g->map_a;
    if (g->staged && (st = rlk_context_tensor_map(ctx, &r_c, &g->map_c))) return st;
    g->M = lines, g->Nn = c->H, g->K = n, g->c0 = 0, g->ksplit = 0, g->out = out, g->out_stride = c->gws;
    g->accumulate = 0;
    if ((st = rlk_ll_bwd_sm90_launch(ctx, &dw, g, g->staged ? LL_BWD_SM90_SMEM_STAGED : LL_BWD_SM90_SMEM, stream)))
      return st;
  }
  return RLK_OK;
}

rlk_status rlk_ll_stored_grads(rlk_context *ctx, const rlk_ll_stored *s, int64_t r0, int64_t n, int first,
                               void *stream) {
  ll_stored_chunk c;
  ll_stored_chunk_of(s, r0, &c);
  rlk_status st;
  if ((st = ll_stored_dz(ctx, s, &c, r0, n, stream))) return st;
  ll_bwd_sm90_args g = {0};
  g.V = c.V, g.temperature = s->temperature, g.group = s->group ? s->group : RLK_LL_BWD_GROUP;
  if (s->grad_hidden.data && (st = ll_stored_dh(ctx, s, &c, r0, n, &g, stream))) return st;
  if (!s->grad_weight.data) return RLK_OK;
  return s->ksplit ? ll_stored_dw_slices(ctx, s, &c, n, &g, stream) : ll_stored_dw(ctx, s, &c, n, first, &g, stream);
}
