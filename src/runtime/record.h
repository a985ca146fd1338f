/* record.h - RLK_JIT_RECORD=FILE: each op call reports its configuration, and the runtime
 * appends its canonical line to FILE once (record.c). */
#ifndef RLK_RECORD_H
#define RLK_RECORD_H

#include "runtime/op.h"

/* Non-zero when RLK_JIT_RECORD names a file (read once per process). Ops test it before
 * building the values of a call. */
int rlk_record_enabled(void);

/* Appends the canonical line of `vals` for op d to the record file unless the process or the
 * file already has it. Never fails the caller: a file that cannot be written is warned about
 * once. */
void rlk_record_op(const rlk_op_desc *d, const rlk_op_values *vals);

/* Points recording at `path` (NULL: off) as if RLK_JIT_RECORD had said so, forgetting what the
 * process recorded before and dropping queued lines: for tests and fuzzing, which need more than
 * one record path in a process. */
void rlk_record_reset(const char *path);

#endif
