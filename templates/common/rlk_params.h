/* rlk_params.h - a kernel's argument struct declared once, as a list, for the three places that
 * need it: the op that fills it (src/ops/, C11), the CUDA/HIP kernel (templates/cuda/, C++17
 * under NVRTC or hiprtc) and the host kernel (templates/host/, C11 under clang). Each side
 * builds its struct from the list with RLK_PARAMS_DECLARE, which also asserts every field's
 * offset and the size against the numbers the list states: no side can drift from the others
 * unnoticed (a reordered field fails to compile on every side).
 *
 * A list is a macro LIST(F, S_) that calls F(S_, type, name, offset) for each field in order, with
 * types every side spells alike (long long, unsigned long long, int, float, double, pointers).
 * No includes: templates are self-contained. Both source sets (templates/cuda, templates/host)
 * hold templates/common. */
#ifndef RLK_PARAMS_H
#define RLK_PARAMS_H

#ifdef __cplusplus
#define RLK_PARAMS_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define RLK_PARAMS_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define RLK_PARAMS_FIELD(T, type, name, offset) type name;

/* C and clang (the op, the host kernels, hiprtc) measure each offset. NVRTC has no offsetof in
 * a constant expression, so there each declared offset is checked to be aligned for its type
 * and inside the struct, and the size is measured: with the op's and the host's exact checks
 * on the same list, a field whose type takes another size or alignment on the device fails. */
#if defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)
#define RLK_PARAMS_OFFSET_IS(T, type, name, offset)                                          \
  RLK_PARAMS_ASSERT((offset) % alignof(type) == 0 && (offset) + sizeof(type) <= sizeof(T), \
                    #T "." #name ": offset does not fit its type");
#else
#define RLK_PARAMS_OFFSET_IS(T, type, name, offset) \
  RLK_PARAMS_ASSERT(__builtin_offsetof(T, name) == (offset), #T "." #name ": offset differs from its declaration");
#endif

/* typedef struct T {...} T; from LIST, then the offset and size checks. */
#define RLK_PARAMS_DECLARE(T, LIST, SIZE)  \
  typedef struct T {                       \
    LIST(RLK_PARAMS_FIELD, T)              \
  } T;                                     \
  LIST(RLK_PARAMS_OFFSET_IS, T)            \
  RLK_PARAMS_ASSERT(sizeof(T) == (SIZE), #T ": size differs from its declaration")

#endif
