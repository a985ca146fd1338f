/* binary_image.h - a bounds check of a kernel binary before a loader sees it. Device
 * drivers and the dynamic loader trust the offsets inside an ELF image; a truncated or
 * corrupt one can make them read past the buffer (or fault on a mapped file) instead of
 * failing. Checking that every header and section lies inside the image turns that into an
 * error the JIT can act on (quarantine and rebuild). */
#ifndef RLK_BINARY_IMAGE_H
#define RLK_BINARY_IMAGE_H

#include <stddef.h>

#include "rlk.h"

/* Checks that `image` is a 64-bit little-endian ELF file of machine `machine` (an EM_*
 * value: EM_CUDA, EM_AMDGPU, EM_X86_64, ...) whose program headers, section headers and
 * section contents all lie within `size` bytes. RLK_OK, or RLK_ERR_BACKEND with
 * "<who>: module_load: <why>". */
rlk_status rlk_elf_image_check(const void *image, size_t size, unsigned machine,
                               const char *who);

/* Non-zero when `image` starts with the ELF magic. */
int rlk_image_is_elf(const void *image, size_t size);

#endif
