/* overlap.c - whether two tensor arguments share memory, exactly: a kernel that writes an output
 * while another argument's bytes lie under it reads what it has just written (or the caller's
 * data is lost), and nothing on the device would say so.
 *
 * Two tensors in separate allocations, or in disjoint slices of one, have disjoint byte ranges
 * and are told apart at once. Interleaved views of one buffer (two columns of one matrix, a
 * padded matrix and something in its padding) have overlapping ranges and are compared element
 * run by element run: a tensor is a base, a run of contiguous bytes, and up to RLK_MAX_DIMS outer
 * (count, stride) pairs; each run of the one with fewer runs is looked up among the other's by
 * index arithmetic. Past a bound on the work the answer is "overlaps" (a layout that costly to
 * tell apart is refused rather than trusted). */
#include <stdint.h>
#include <string.h>

#include "core/core.h"
#include "runtime/overlap.h"

/* Steps of the exact comparison before it gives up and calls a pair overlapping. */
#define OVERLAP_WORK_MAX ((uint64_t)1 << 22)

typedef struct span_form {
  uint64_t base; /* address of the first element */
  uint64_t run;  /* contiguous bytes at each position */
  int nd;        /* outer dimensions, by ascending stride */
  uint64_t count[RLK_MAX_DIMS], stride[RLK_MAX_DIMS];
  uint64_t extent[RLK_MAX_DIMS]; /* bytes from a position of dimension k to the end of its last run */
  uint64_t runs;                 /* the number of runs: the product of the counts */
} span_form;

/* The span form of a tensor that rlk_check_tensor accepted. A dimension of stride 0 repeats the
 * same bytes and adds none (repeats is set: a written tensor must not have any). */
static void span_form_of(const rlk_tensor *t, span_form *f, int *repeats) {
  const uint64_t es = rlk_dtype_size(t->dtype);
  uint64_t cnt[RLK_MAX_DIMS], str[RLK_MAX_DIMS];
  int n = 0;
  *repeats = 0;
  for (int i = 0; i < t->ndim; i++) {
    if (t->shape[i] <= 1) continue;
    if (t->strides[i] == 0) {
      *repeats = 1;
      continue;
    }
    cnt[n] = (uint64_t)t->shape[i];
    str[n] = (uint64_t)t->strides[i] * es;
    n++;
  }
  for (int i = 1; i < n; i++) /* insertion sort by stride */
    for (int j = i; j > 0 && str[j] < str[j - 1]; j--) {
      uint64_t c = cnt[j], s = str[j];
      cnt[j] = cnt[j - 1], str[j] = str[j - 1];
      cnt[j - 1] = c, str[j - 1] = s;
    }
  memset(f, 0, sizeof *f);
  f->base = (uint64_t)(uintptr_t)t->data;
  f->run = es;
  int i = 0;
  while (i < n && str[i] == f->run) f->run *= cnt[i++]; /* contiguous from the element up */
  for (; i < n; i++) {
    if (f->nd && str[i] == f->count[f->nd - 1] * f->stride[f->nd - 1]) {
      f->count[f->nd - 1] *= cnt[i]; /* continues the dimension below it */
      continue;
    }
    f->count[f->nd] = cnt[i];
    f->stride[f->nd] = str[i];
    f->nd++;
  }
  f->runs = 1;
  uint64_t inner = f->run;
  for (int k = 0; k < f->nd; k++) {
    f->extent[k] = (f->count[k] - 1) * f->stride[k] + inner;
    inner = f->extent[k];
    f->runs *= f->count[k];
  }
}

static uint64_t span_end(const span_form *f) { return f->base + (f->nd ? f->extent[f->nd - 1] : f->run); }

/* Whether a run of f (dimensions above k fixed, giving `base`) meets [lo, hi). */
static int hits(const span_form *f, int k, uint64_t base, uint64_t lo, uint64_t hi, uint64_t *work) {
  if (k < 0) return base < hi && lo < base + f->run;
  if (*work == 0) return 1;
  (*work)--;
  const uint64_t inner = k ? f->extent[k - 1] : f->run, s = f->stride[k];
  if (hi <= base) return 0;
  /* positions base + i s meet [lo, hi) when base + i s < hi and base + i s + inner > lo */
  uint64_t first = 0;
  if (lo >= base + inner) first = (lo - base - inner) / s + 1;
  uint64_t last = (hi - 1 - base) / s;
  if (last >= f->count[k]) last = f->count[k] - 1;
  for (uint64_t i = first; i <= last; i++)
    if (hits(f, k - 1, base + i * s, lo, hi, work)) return 1;
  return 0;
}

/* Whether the runs of a meet those of b (a has the fewer runs). */
static int forms_meet(const span_form *a, const span_form *b) {
  uint64_t work = OVERLAP_WORK_MAX;
  uint64_t idx[RLK_MAX_DIMS] = {0};
  for (uint64_t r = 0; r < a->runs; r++) {
    uint64_t pos = a->base;
    for (int k = 0; k < a->nd; k++) pos += idx[k] * a->stride[k];
    if (hits(b, b->nd - 1, b->base, pos, pos + a->run, &work)) return 1;
    if (work == 0) return 1;
    work--;
    for (int k = 0; k < a->nd && ++idx[k] == a->count[k]; k++) idx[k] = 0;
  }
  return 0;
}

int rlk_tensors_overlap(const rlk_tensor *a, const rlk_tensor *b) {
  if (!a->data || !b->data) return 0;
  span_form fa, fb;
  int ra, rb;
  span_form_of(a, &fa, &ra);
  span_form_of(b, &fb, &rb);
  if (span_end(&fa) <= fb.base || span_end(&fb) <= fa.base) return 0;
  return fa.runs <= fb.runs ? forms_meet(&fa, &fb) : forms_meet(&fb, &fa);
}

/* Whether a tensor's elements are each at a place of their own: no stride-0 dimension, and each
 * dimension steps past everything below it (sufficient; stranger interleavings are refused). */
static int distinct_places(const rlk_tensor *t) {
  span_form f;
  int repeats;
  span_form_of(t, &f, &repeats);
  if (repeats) return 0;
  uint64_t inner = f.run;
  for (int k = 0; k < f.nd; k++) {
    if (f.stride[k] < inner) return 0;
    inner = f.extent[k];
  }
  return 1;
}

static int same_layout(const rlk_tensor *a, const rlk_tensor *b) {
  if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->strides[i] != b->strides[i])) return 0;
  return 1;
}

/* [lo, hi) of the bytes a tensor reaches (rlk_check_tensor accepted it: no overflow). */
static void byte_range(const rlk_tensor *t, uint64_t *lo, uint64_t *hi) {
  uint64_t last = 0;
  for (int i = 0; i < t->ndim; i++) last += (uint64_t)(t->shape[i] - 1) * (uint64_t)t->strides[i];
  *lo = (uint64_t)(uintptr_t)t->data;
  *hi = *lo + (last + 1) * rlk_dtype_size(t->dtype);
}

/* A row-major layout whose every dimension steps past the ones inside it: the common case of a
 * written tensor, told at once (distinct_places decides the rest). */
static int plainly_distinct(const rlk_tensor *t) {
  int64_t inner = 1; /* elements the dimensions inside span */
  for (int i = t->ndim - 1; i >= 0; i--) {
    if (t->shape[i] == 1) continue;
    if (t->strides[i] < inner) return 0;
    inner = t->strides[i] * t->shape[i];
  }
  return 1;
}

rlk_status rlk_check_no_overlap(const rlk_arg_ref *args, size_t n) {
  uint64_t lo[RLK_ARG_FIELDS_MAX + 1], hi[RLK_ARG_FIELDS_MAX + 1];
  if (n > RLK_ARG_FIELDS_MAX + 1)
    return rlk_error(RLK_ERR_INTERNAL, "rlk_check_no_overlap: %zu arguments, at most %d", n, RLK_ARG_FIELDS_MAX + 1);
  for (size_t i = 0; i < n; i++)
    if (args[i].t && args[i].t->data) byte_range(args[i].t, &lo[i], &hi[i]);
  for (size_t i = 0; i < n; i++) {
    const rlk_arg_ref *x = &args[i];
    if (!x->t || !x->t->data) continue;
    if (x->written && !plainly_distinct(x->t) && !distinct_places(x->t))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                       "%s: its elements share memory (a stride of 0, or strides that interleave): an "
                       "output needs a place of its own for each element",
                       x->name);
    for (size_t j = i + 1; j < n; j++) {
      const rlk_arg_ref *y = &args[j];
      if (!y->t || !y->t->data || !(x->written || y->written)) continue;
      if (hi[i] <= lo[j] || hi[j] <= lo[i]) continue; /* apart: the usual case, decided here */
      if ((x->in_place == y->t || y->in_place == x->t) && same_layout(x->t, y->t)) continue;
      if (rlk_tensors_overlap(x->t, y->t))
        return rlk_error(RLK_ERR_INVALID_ARGUMENT,
                         "%s: overlaps %s (what a call writes shares memory with no other argument%s)",
                         x->written ? x->name : y->name, x->written ? y->name : x->name,
                         (x->in_place == y->t || y->in_place == x->t) ? ", except as the same tensor in place"
                                                                       : "");
    }
  }
  return RLK_OK;
}

rlk_status rlk_check_arg_fields(const rlk_arg_field *fields, size_t n, const void *args, const void *workspace,
                                size_t workspace_bytes) {
  rlk_arg_ref refs[RLK_ARG_FIELDS_MAX + 1];
  if (n > RLK_ARG_FIELDS_MAX)
    return rlk_error(RLK_ERR_INTERNAL, "rlk_check_arg_fields: %zu fields, at most %d", n, RLK_ARG_FIELDS_MAX);
  for (size_t i = 0; i < n; i++) {
    refs[i].t = (const rlk_tensor *)((const char *)args + fields[i].offset);
    /* a field the call's settings leave unread was not validated: it must still be a tensor (or
     * a 0-d one, as a loss's normalizer may be) before its bytes are compared with the others' */
    rlk_status st = refs[i].t->ndim == 0 ? RLK_OK : rlk_check_tensor(refs[i].t, fields[i].name, 0);
    if (st) return st;
    refs[i].name = fields[i].name;
    refs[i].written = fields[i].written;
    refs[i].in_place = NULL;
  }
  for (size_t i = 0; i < n; i++)
    if (fields[i].in_place_of) {
      for (size_t j = 0; j < n; j++)
        if (!strcmp(fields[j].name, fields[i].in_place_of)) refs[i].in_place = refs[j].t;
    }
  rlk_tensor ws = rlk_workspace_tensor((void *)workspace, workspace_bytes);
  refs[n].t = &ws;
  refs[n].name = "workspace";
  refs[n].written = 1;
  refs[n].in_place = NULL;
  return rlk_check_no_overlap(refs, n + 1);
}
