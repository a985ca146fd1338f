/* rlk_params.h - a kernel's argument struct and its template values, declared once for the three
 * places that need them: the op that fills the struct and chooses the values (src/ops/, C11),
 * the CUDA/HIP kernel (templates/cuda/, C++17 under NVRTC or hiprtc) and the host kernel
 * (templates/host/, C11 under clang). Both source sets (templates/cuda, templates/host) hold
 * templates/common, where an op's params header keeps them. No includes: templates are
 * self-contained.
 *
 * An argument struct is a list, a macro LIST(F, S_) that calls F(S_, type, name, offset) for each
 * field in order (F(S_, type, name, offset, [n]) for an array of n), and a size. The params
 * header declares the struct from it with RLK_PARAMS_DECLARE, so every side has the same type by
 * the same name; the declaration asserts each field's offset and the size against the numbers
 * the list states, so no compiler can lay it out otherwise unnoticed (a reordered or retyped field
 * fails to compile on every side). A field's type is spelled alike on every side: long long,
 * unsigned long long, int, float, double, pointers, rlk_tensor_map, or another list's struct (a
 * sub-list the header declared first: a part several structs share).
 *
 * A kernel takes its struct as its one parameter, `RLK_PARAMS_ARG T p_` (const __grid_constant__
 * on CUDA: the fields stay in parameter space, read where they are used), and a launch passes a
 * pointer to the struct the op filled (rlk_context_launch_params). */
#ifndef RLK_PARAMS_H
#define RLK_PARAMS_H

#ifdef __cplusplus
#define RLK_PARAMS_ASSERT(cond, msg) static_assert(cond, msg)
#define RLK_PARAMS_ALIGNAS(n) alignas(n)
#else
#define RLK_PARAMS_ASSERT(cond, msg) _Static_assert(cond, msg)
#define RLK_PARAMS_ALIGNAS(n) _Alignas(n)
#endif

/* A tensor map (a CUtensorMap: 128 opaque bytes, 64-byte aligned) as a field. The op encodes it
 * for each launch (rlk_context_tensor_map) into the struct it launches with, which the field
 * makes 64-byte aligned; the kernel, taking the struct __grid_constant__, hands the copy engine
 * the field's address in parameter space (&p_.map). */
typedef struct rlk_tensor_map {
  RLK_PARAMS_ALIGNAS(64) unsigned long long opaque[16];
} rlk_tensor_map;
RLK_PARAMS_ASSERT(sizeof(rlk_tensor_map) == 128, "rlk_tensor_map: 128 bytes");

/* A sub-list of two fields: a pointer to rows and their stride (in elements, long long) right
 * after it, the form most tensors take in a kernel's arguments. */
#define RLK_PARAMS_STRIDED(F, S_, type, name, stride, offset) \
  F(S_, type, name, offset)                                   \
  F(S_, long long, stride, (offset) + 8)

/* `dims`: nothing, or an array's [n]. */
#define RLK_PARAMS_FIELD(T, type, name, offset, ...) type name __VA_ARGS__;

/* C and clang (the op, the host kernels, hiprtc) measure each offset. NVRTC has no offsetof in
 * a constant expression, so there each declared offset is checked to be aligned for its type
 * and inside the struct, and the size is measured: with the op's and the host's exact checks
 * on the same list, a field whose type takes another size or alignment on the device fails. */
#if defined(__CUDACC_RTC__) && !defined(__HIPCC_RTC__)
#define RLK_PARAMS_OFFSET_IS(T, type, name, offset, ...)                                   \
  RLK_PARAMS_ASSERT((offset) % alignof(type) == 0 && (offset) + sizeof(type) <= sizeof(T), \
                    #T "." #name ": offset does not fit its type");
#else
#define RLK_PARAMS_OFFSET_IS(T, type, name, offset, ...) \
  RLK_PARAMS_ASSERT(__builtin_offsetof(T, name) == (offset), #T "." #name ": offset differs from its declaration");
#endif

/* typedef struct T {...} T; from LIST, then the offset and size checks. */
#define RLK_PARAMS_DECLARE(T, LIST, SIZE)  \
  typedef struct T {                       \
    LIST(RLK_PARAMS_FIELD, T)              \
  } T;                                     \
  LIST(RLK_PARAMS_OFFSET_IS, T)            \
  RLK_PARAMS_ASSERT(sizeof(T) == (SIZE), #T ": size differs from its declaration")

/* A template value with a few named choices (a mask kind, a mode) is a list too, X(ID, "name") for
 * each choice in value order: RLK_PARAMS_ENUM(LIST) declares the enum every side uses (ID is the
 * value, from 0), RLK_PARAMS_ENUM_NAMES(LIST) the op's NULL-terminated names for the schema and
 * the settings that spell it (a name's index is its value). */
#define RLK_PARAMS_ENUM_ID(id, name) id,
#define RLK_PARAMS_ENUM_NAME(id, name) name,
#define RLK_PARAMS_ENUM(LIST) enum { LIST(RLK_PARAMS_ENUM_ID) }
#define RLK_PARAMS_ENUM_NAMES(LIST) {LIST(RLK_PARAMS_ENUM_NAME) 0}

#endif
