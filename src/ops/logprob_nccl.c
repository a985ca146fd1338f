/* logprob_nccl.c - rlk_logprob_vocab_parallel: the shard forward, one in-place ncclAllGather of
 * the records and the combine, on the caller's stream; and how libnccl is found.
 *
 * libnccl is never linked. The communicator belongs to the library that created it, so the copy
 * already in the process comes first (PyTorch's wheel: RTLD_NOLOAD of the usual sonames), then
 * RLK_NCCL_LIB (when set, the only other candidate: a named library that fails is an error, not
 * a reason to pick another one), then the system's. Only NCCL's stable C ABI is used: opaque
 * communicator, int enums (ncclFloat32 = 7), the functions below. Once a library is opened it is
 * kept for the process. */
#include <pthread.h>
#include <string.h>

#include "core/core.h"
#include "core/dynlib.h"
#include "ops/logprob_shard.h"
#include "ops/ops.h"

typedef int nccl_result; /* ncclResult_t; ncclSuccess = 0 */
enum { NCCL_FLOAT32 = 7 };

typedef struct nccl_api {
  nccl_result (*get_version)(int *version);
  const char *(*get_error_string)(nccl_result r);
  nccl_result (*comm_count)(void *comm, int *count);
  nccl_result (*comm_user_rank)(void *comm, int *rank);
  nccl_result (*all_gather)(const void *send, void *recv, size_t count, int datatype, void *comm,
                            void *stream);
} nccl_api;

static pthread_mutex_t nccl_lock = PTHREAD_MUTEX_INITIALIZER;
static rlk_dynlib nccl_lib;
static nccl_api nccl_fn;
static int nccl_version_code;
static int nccl_ready; /* under nccl_lock; once 1, nccl_fn and nccl_lib stay as they are */

/* Opens libnccl (once per process on success); *api the table. */
static rlk_status nccl_load(const nccl_api **api) {
  pthread_mutex_lock(&nccl_lock);
  if (nccl_ready) {
    pthread_mutex_unlock(&nccl_lock);
    *api = &nccl_fn;
    return RLK_OK;
  }
  nccl_api fn;
  memset(&fn, 0, sizeof fn);
  const rlk_dynlib_symbol symbols[] = {
      {"ncclGetVersion", &fn.get_version, 0},       {"ncclGetErrorString", &fn.get_error_string, 0},
      {"ncclCommCount", &fn.comm_count, 0},         {"ncclCommUserRank", &fn.comm_user_rank, 0},
      {"ncclAllGather", &fn.all_gather, 0},
  };
  const size_t ns = sizeof symbols / sizeof symbols[0];
  static const char *const sonames[] = {"libnccl.so.2", "libnccl.so"};
  rlk_dynlib lib;
  char loaded_why[768] = "", named_why[768] = "";
  rlk_status st = rlk_dynlib_open_loaded(&lib, "nccl", sonames, 2, symbols, ns);
  if (st) {
    rlk_format(loaded_why, sizeof loaded_why, "%s", rlk_last_error());
    const char *named = rlk_env("RLK_NCCL_LIB");
    if (named)
      st = rlk_dynlib_open(&lib, "nccl (RLK_NCCL_LIB)", &named, 1, symbols, ns);
    else
      st = rlk_dynlib_open(&lib, "nccl (system)", sonames, 2, symbols, ns);
    if (st) rlk_format(named_why, sizeof named_why, "%s", rlk_last_error());
  }
  int version = 0;
  if (!st && (fn.get_version(&version) != 0 || version / 10000 != 2)) {
    rlk_format(named_why, sizeof named_why, "nccl: %s reports version code %d, not NCCL 2.x",
               lib.path, version);
    rlk_dynlib_close(&lib);
    st = RLK_ERR_UNAVAILABLE;
  }
  if (st) {
    pthread_mutex_unlock(&nccl_lock);
    return rlk_error(RLK_ERR_UNAVAILABLE,
                     "libnccl is not available: in this process: %s; then: %s (set RLK_NCCL_LIB to "
                     "the library that created the communicator)",
                     loaded_why, named_why[0] ? named_why : "-");
  }
  nccl_lib = lib;
  nccl_fn = fn;
  nccl_version_code = version;
  nccl_ready = 1;
  pthread_mutex_unlock(&nccl_lock);
  rlk_debug("nccl: %s, version %d", nccl_lib.path, version);
  *api = &nccl_fn;
  return RLK_OK;
}

RLK_API rlk_status rlk_nccl_version(int *version, char *path, size_t size) {
  if (!version) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "rlk_nccl_version: version is NULL");
  const nccl_api *api;
  rlk_status st = nccl_load(&api);
  if (st) return st;
  *version = nccl_version_code;
  if (path && size) rlk_format(path, size, "%s", nccl_lib.path);
  return RLK_OK;
}

/* The communicator's rank count and this rank. */
static rlk_status nccl_ranks(const nccl_api *api, void *comm, int *P, int *rank) {
  nccl_result r = api->comm_count(comm, P);
  if (r == 0 && rank) r = api->comm_user_rank(comm, rank);
  if (r != 0)
    return rlk_error(RLK_ERR_BACKEND, "nccl: the communicator's rank count or rank: %s",
                     api->get_error_string(r));
  if (*P < 1 || (rank && (*rank < 0 || *rank >= *P)))
    return rlk_error(RLK_ERR_BACKEND, "nccl: the communicator reports rank %d of %d",
                     rank ? *rank : 0, *P);
  return RLK_OK;
}

RLK_API void rlk_logprob_vocab_parallel_args_init(rlk_logprob_vocab_parallel_args *args) {
  if (!args) return;
  memset(args, 0, sizeof *args);
  rlk_logprob_args_init(&args->fwd);
}

/* N from the labels (checked fully by the shard forward). */
static rlk_status vp_rows(const rlk_logprob_vocab_parallel_args *a, int64_t *N) {
  rlk_status st;
  if ((st = rlk_check_tensor(&a->fwd.labels, "labels", 1))) return st;
  if ((st = rlk_check_ndim(&a->fwd.labels, "labels", 1, 1))) return st;
  if (!a->nccl_comm) return rlk_error(RLK_ERR_INVALID_ARGUMENT, "nccl_comm: NULL");
  *N = a->fwd.labels.shape[0];
  return RLK_OK;
}

static rlk_status vp_require_cuda(const rlk_context *ctx) {
  if (ctx->kind == RLK_BACKEND_CUDA) return RLK_OK;
  return rlk_error(RLK_ERR_UNSUPPORTED,
                   "rlk_logprob_vocab_parallel: NCCL needs the CUDA backend (elsewhere, gather "
                   "rlk_logprob's shard records yourself and call rlk_logprob_combine)");
}

/* A call: the communicator's ranks. */
typedef struct vp_call {
  rlk_op_call op;
  const nccl_api *api;
  int P, rank;
  int64_t N;
} vp_call;

static rlk_status vp_validate(const rlk_context *ctx, const void *args, rlk_op_call *call) {
  const rlk_logprob_vocab_parallel_args *a = args;
  vp_call *c = (vp_call *)call;
  rlk_status st = vp_rows(a, &c->N);
  if (st) return st;
  if (a->fwd.partials.data)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                     "fwd.partials: absent (the records live in the workspace)");
  if ((st = rlk_logprob_combine_check_outputs(&a->fwd.logp, &a->fwd.lse, &a->fwd.entropy, &a->fwd.status, c->N)))
    return st;
  if ((st = vp_require_cuda(ctx))) return st;
  if ((st = nccl_load(&c->api))) return st;
  if ((st = nccl_ranks(c->api, a->nccl_comm, &c->P, &c->rank))) return st;
  call->workspace = (size_t)c->P * (size_t)c->N * RLK_LOGPROB_PARTIAL_FIELDS * sizeof(float);
  return RLK_OK;
}

/* The shard's records into this rank's slot of the workspace (rlk_logprob checks the logits and
 * labels), one in-place all-gather on the stream, then the combine. */
static rlk_status vp_launch(rlk_context *ctx, const void *args, rlk_op_call *call, void *stream) {
  const rlk_logprob_vocab_parallel_args *a = args;
  const vp_call *c = (const vp_call *)call;
  const int64_t N = c->N;
  const size_t slot = (size_t)N * RLK_LOGPROB_PARTIAL_FIELDS; /* floats per rank */
  float *all = (float *)a->workspace, *mine = all + (size_t)c->rank * slot;
  rlk_logprob_args sa = a->fwd;
  sa.logp = sa.lse = sa.entropy = sa.status = (rlk_tensor){0};
  sa.partials = rlk_tensor_2d(mine, RLK_F32, N, RLK_LOGPROB_PARTIAL_FIELDS, RLK_LOGPROB_PARTIAL_FIELDS);
  sa.partial_entropy = a->fwd.entropy.data != NULL;
  rlk_status st = rlk_logprob(ctx, &sa, stream);
  if (st) return st;
  const nccl_result r = c->api->all_gather(mine, all, slot, NCCL_FLOAT32, a->nccl_comm, stream);
  if (r != 0)
    return rlk_error(RLK_ERR_BACKEND, "nccl: ncclAllGather of %zu floats per rank: %s", slot,
                     c->api->get_error_string(r));
  rlk_logprob_combine_args ca;
  rlk_logprob_combine_args_init(&ca);
  ca.partials = (rlk_tensor){all, RLK_F32, 3, {c->P, N, RLK_LOGPROB_PARTIAL_FIELDS},
                             {(int64_t)slot, RLK_LOGPROB_PARTIAL_FIELDS, 1}};
  ca.labels = a->fwd.labels;
  ca.ignore_index = a->fwd.ignore_index;
  ca.logp = a->fwd.logp;
  ca.lse = a->fwd.lse;
  ca.entropy = a->fwd.entropy;
  ca.status = a->fwd.status;
  return rlk_logprob_combine(ctx, &ca, stream);
}

static const rlk_arg_field vp_fields[] = {
    RLK_ARG_IN(rlk_logprob_vocab_parallel_args, fwd.logits),  RLK_ARG_IN(rlk_logprob_vocab_parallel_args, fwd.labels),
    RLK_ARG_OUT(rlk_logprob_vocab_parallel_args, fwd.logp),   RLK_ARG_OUT(rlk_logprob_vocab_parallel_args, fwd.lse),
    RLK_ARG_OUT(rlk_logprob_vocab_parallel_args, fwd.entropy), RLK_ARG_OUT(rlk_logprob_vocab_parallel_args, fwd.status)};

/* No configuration line of its own: the shard forward and the combine record theirs. */
static const rlk_op_entry vp_entry = {
    .name = "rlk_logprob_vocab_parallel", .call_size = sizeof(vp_call), RLK_OP_FIELDS(vp_fields),
    .workspace = RLK_OP_WORKSPACE(rlk_logprob_vocab_parallel_args, 16), .validate = vp_validate, .launch = vp_launch};

RLK_OP_DEFINE_CALL_AND_SIZE(rlk_logprob_vocab_parallel, rlk_logprob_vocab_parallel_args, vp_entry)
