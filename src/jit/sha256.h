/* sha256.h - SHA-256 (FIPS 180-4), used for cache keys and entry checksums. */
#ifndef RLK_SHA256_H
#define RLK_SHA256_H

#include <stddef.h>
#include <stdint.h>

typedef struct rlk_sha256 {
  uint32_t state[8];
  uint64_t length; /* bytes hashed so far */
  uint8_t block[64];
  size_t fill;
} rlk_sha256;

void rlk_sha256_init(rlk_sha256 *ctx);
void rlk_sha256_update(rlk_sha256 *ctx, const void *data, size_t size);
void rlk_sha256_final(rlk_sha256 *ctx, uint8_t digest[32]);

/* One-shot digest. (Not named rlk_sha256: that name is the context type.) */
void rlk_sha256_digest(const void *data, size_t size, uint8_t digest[32]);

/* Lower-case hex of a digest; `hex` holds 65 bytes. */
void rlk_sha256_hex(const uint8_t digest[32], char hex[65]);

#endif
