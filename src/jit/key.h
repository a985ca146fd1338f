/* key.h - the cache key of a compiled kernel (docs/cache.md, "Key").
 *
 * SHA-256 over a canonical serialization: each field as "<name>\0<decimal length>\0<bytes>"
 * in the fixed order below. Every field is kept in clear in the entry's metadata so an entry
 * can be re-verified from its own files. */
#ifndef RLK_KEY_H
#define RLK_KEY_H

#include <stddef.h>
#include <stdint.h>

#include "rlk.h"

/* Bump when the key or the on-disk format changes: every old entry is orphaned. */
#define RLK_CACHE_SCHEMA 1
/* Bump when the runtime's code generation changes without a template change. */
#define RLK_CODEGEN_VERSION 1

typedef struct rlk_kernel_key {
  int schema;              /* RLK_CACHE_SCHEMA */
  char family[64];         /* template family: "group_advantage" */
  char entry[64];          /* kernel entry: "group_advantage" */
  char template_digest[65];/* digest of the source set the compiler sees */
  char params[512];        /* "name=value ..." sorted by name */
  char names[512];         /* the name expressions (or host symbols), ';'-joined */
  char target[32];         /* "sm_90a" */
  char compiler[64];       /* "nvrtc-13.0" */
  char options[1024];      /* the normalized options actually passed, ' '-joined */
  int codegen;             /* RLK_CODEGEN_VERSION */
  char env[256];           /* allow-listed code-affecting environment, "NAME=value;..." */

  uint8_t hash[32];        /* filled by rlk_key_finish */
  char hex[65];
} rlk_kernel_key;

/* Number of serialized fields and their names, in order (for metadata and tests). */
#define RLK_KEY_NFIELDS 11
extern const char *const rlk_key_field_names[RLK_KEY_NFIELDS];

/* The text of field `i` of a key (integers in decimal), written into buf. */
void rlk_key_field(const rlk_kernel_key *key, int i, char *buf, size_t size);

/* Sets field `i` from text; RLK_ERR_INVALID_ARGUMENT if it does not fit or parse. */
rlk_status rlk_key_set_field(rlk_kernel_key *key, int i, const char *text);

/* Computes hash and hex from the fields. */
void rlk_key_finish(rlk_kernel_key *key);

/* The canonical serialization hashed by rlk_key_finish; returns its length (it may exceed
 * size, in which case buf holds a prefix). */
size_t rlk_key_serialize(const rlk_kernel_key *key, char *buf, size_t size);

/* The allow-listed environment variables that change generated code (none today); writes
 * "NAME=value;..." for those that are set. */
void rlk_key_env(char *buf, size_t size);

#endif
