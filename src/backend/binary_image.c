/* binary_image.c - ELF bounds checks for kernel binaries (see binary_image.h). */
#include "backend/binary_image.h"

#include <elf.h>
#include <stdint.h>
#include <string.h>

#include "core/core.h"

int rlk_image_is_elf(const void *image, size_t size) {
  return image && size >= SELFMAG && memcmp(image, ELFMAG, SELFMAG) == 0;
}

/* Is [offset, offset + length) inside [0, size)? Written so no sum can overflow. */
static int in_bounds(uint64_t offset, uint64_t length, size_t size) {
  return offset <= size && length <= size - offset;
}

static const char *machine_name(unsigned machine) {
  switch (machine) {
  case EM_X86_64: return "x86-64";
  case EM_AARCH64: return "aarch64";
  case EM_PPC64: return "ppc64";
  case 190: return "cuda"; /* EM_CUDA */
  case 224: return "amdgpu"; /* EM_AMDGPU */
  default: return "another machine";
  }
}

rlk_status rlk_elf_image_check(const void *image, size_t size, unsigned machine,
                               const char *who) {
  if (!image || size == 0)
    return rlk_error(RLK_ERR_BACKEND, "%s: module_load: empty image", who);
  if (!rlk_image_is_elf(image, size))
    return rlk_error(RLK_ERR_BACKEND, "%s: module_load: not an ELF image (%zu bytes)", who, size);
  if (size < sizeof(Elf64_Ehdr))
    return rlk_error(RLK_ERR_BACKEND, "%s: module_load: truncated ELF header (%zu bytes)", who,
                     size);
  /* The image may be any byte buffer: copy headers out instead of casting in place. */
  Elf64_Ehdr eh;
  memcpy(&eh, image, sizeof eh);
  if (eh.e_ident[EI_CLASS] != ELFCLASS64 || eh.e_ident[EI_DATA] != ELFDATA2LSB)
    return rlk_error(RLK_ERR_BACKEND, "%s: module_load: not a 64-bit little-endian ELF image",
                     who);
  if (eh.e_machine != machine)
    return rlk_error(RLK_ERR_BACKEND,
                     "%s: module_load: ELF image is for %s (e_machine %u), expected %s", who,
                     machine_name(eh.e_machine), (unsigned)eh.e_machine, machine_name(machine));

  const unsigned char *bytes = image;
  if (eh.e_phnum) {
    if (eh.e_phentsize != sizeof(Elf64_Phdr) ||
        !in_bounds(eh.e_phoff, (uint64_t)eh.e_phnum * sizeof(Elf64_Phdr), size))
      return rlk_error(RLK_ERR_BACKEND,
                       "%s: module_load: program headers lie outside the %zu-byte image", who,
                       size);
    for (unsigned i = 0; i < eh.e_phnum; i++) {
      Elf64_Phdr ph;
      memcpy(&ph, bytes + eh.e_phoff + (uint64_t)i * sizeof ph, sizeof ph);
      if (!in_bounds(ph.p_offset, ph.p_filesz, size))
        return rlk_error(RLK_ERR_BACKEND,
                         "%s: module_load: segment %u lies outside the %zu-byte image (truncated?)",
                         who, i, size);
    }
  }
  if (eh.e_shnum) {
    if (eh.e_shentsize != sizeof(Elf64_Shdr) ||
        !in_bounds(eh.e_shoff, (uint64_t)eh.e_shnum * sizeof(Elf64_Shdr), size))
      return rlk_error(RLK_ERR_BACKEND,
                       "%s: module_load: section headers lie outside the %zu-byte image (truncated?)",
                       who, size);
    for (unsigned i = 0; i < eh.e_shnum; i++) {
      Elf64_Shdr sh;
      memcpy(&sh, bytes + eh.e_shoff + (uint64_t)i * sizeof sh, sizeof sh);
      if (sh.sh_type == SHT_NOBITS || sh.sh_type == SHT_NULL) continue;
      if (!in_bounds(sh.sh_offset, sh.sh_size, size))
        return rlk_error(RLK_ERR_BACKEND,
                         "%s: module_load: section %u lies outside the %zu-byte image (truncated?)",
                         who, i, size);
    }
  }
  if (!eh.e_phnum && !eh.e_shnum)
    return rlk_error(RLK_ERR_BACKEND, "%s: module_load: ELF image has no segments or sections",
                     who);
  return RLK_OK;
}
