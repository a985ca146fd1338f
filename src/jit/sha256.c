/* sha256.c - SHA-256 as specified in FIPS 180-4, portable C.
 *
 * The compression function keeps the message schedule in a 16-word ring and runs the
 * 64 rounds eight at a time with the working variables rotated by macro arguments, so
 * no register shuffling happens between rounds. */
#include "jit/sha256.h"

#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98u, 0x71374491u, 0xb5c0fbcfu, 0xe9b5dba5u, 0x3956c25bu, 0x59f111f1u, 0x923f82a4u,
    0xab1c5ed5u, 0xd807aa98u, 0x12835b01u, 0x243185beu, 0x550c7dc3u, 0x72be5d74u, 0x80deb1feu,
    0x9bdc06a7u, 0xc19bf174u, 0xe49b69c1u, 0xefbe4786u, 0x0fc19dc6u, 0x240ca1ccu, 0x2de92c6fu,
    0x4a7484aau, 0x5cb0a9dcu, 0x76f988dau, 0x983e5152u, 0xa831c66du, 0xb00327c8u, 0xbf597fc7u,
    0xc6e00bf3u, 0xd5a79147u, 0x06ca6351u, 0x14292967u, 0x27b70a85u, 0x2e1b2138u, 0x4d2c6dfcu,
    0x53380d13u, 0x650a7354u, 0x766a0abbu, 0x81c2c92eu, 0x92722c85u, 0xa2bfe8a1u, 0xa81a664bu,
    0xc24b8b70u, 0xc76c51a3u, 0xd192e819u, 0xd6990624u, 0xf40e3585u, 0x106aa070u, 0x19a4c116u,
    0x1e376c08u, 0x2748774cu, 0x34b0bcb5u, 0x391c0cb3u, 0x4ed8aa4au, 0x5b9cca4fu, 0x682e6ff3u,
    0x748f82eeu, 0x78a5636fu, 0x84c87814u, 0x8cc70208u, 0x90befffau, 0xa4506cebu, 0xbef9a3f7u,
    0xc67178f2u};

#define ROTR(x, n) (((x) >> (n)) | ((x) << (32 - (n))))
#define CH(x, y, z) (((x) & (y)) ^ (~(x) & (z)))
#define MAJ(x, y, z) (((x) & (y)) ^ ((x) & (z)) ^ ((y) & (z)))
#define BSIG0(x) (ROTR(x, 2) ^ ROTR(x, 13) ^ ROTR(x, 22))
#define BSIG1(x) (ROTR(x, 6) ^ ROTR(x, 11) ^ ROTR(x, 25))
#define SSIG0(x) (ROTR(x, 7) ^ ROTR(x, 18) ^ ((x) >> 3))
#define SSIG1(x) (ROTR(x, 17) ^ ROTR(x, 19) ^ ((x) >> 10))

static uint32_t load_be32(const uint8_t *p) {
  return ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16) | ((uint32_t)p[2] << 8) | (uint32_t)p[3];
}

static void store_be32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)(v >> 24);
  p[1] = (uint8_t)(v >> 16);
  p[2] = (uint8_t)(v >> 8);
  p[3] = (uint8_t)v;
}

/* Schedule word t (t >= 16) computed in place in the ring w[t & 15]. */
#define SCHED(t)                                                                              \
  (w[(t)&15] += SSIG1(w[((t)-2) & 15]) + w[((t)-7) & 15] + SSIG0(w[((t)-15) & 15]))

/* One round with the working variables named by position; word expression W. */
#define ROUND(a, b, c, d, e, f, g, h, t, W)                                                   \
  do {                                                                                        \
    uint32_t t1_ = (h) + BSIG1(e) + CH(e, f, g) + K[t] + (W);                                \
    uint32_t t2_ = BSIG0(a) + MAJ(a, b, c);                                                   \
    (d) += t1_;                                                                               \
    (h) = t1_ + t2_;                                                                          \
  } while (0)

/* Eight rounds starting at t; after them the variables are back in their original roles. */
#define ROUNDS8(t, WX)                                                                        \
  do {                                                                                        \
    ROUND(a, b, c, d, e, f, g, h, (t) + 0, WX((t) + 0));                                      \
    ROUND(h, a, b, c, d, e, f, g, (t) + 1, WX((t) + 1));                                      \
    ROUND(g, h, a, b, c, d, e, f, (t) + 2, WX((t) + 2));                                      \
    ROUND(f, g, h, a, b, c, d, e, (t) + 3, WX((t) + 3));                                      \
    ROUND(e, f, g, h, a, b, c, d, (t) + 4, WX((t) + 4));                                      \
    ROUND(d, e, f, g, h, a, b, c, (t) + 5, WX((t) + 5));                                      \
    ROUND(c, d, e, f, g, h, a, b, (t) + 6, WX((t) + 6));                                      \
    ROUND(b, c, d, e, f, g, h, a, (t) + 7, WX((t) + 7));                                      \
  } while (0)

#define WLOAD(t) (w[(t)&15])
#define WSCHED(t) SCHED(t)

static void compress(uint32_t state[8], const uint8_t *block, size_t nblocks) {
  uint32_t w[16];
  while (nblocks--) {
    for (int i = 0; i < 16; i++) w[i] = load_be32(block + 4 * i);
    uint32_t a = state[0], b = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    ROUNDS8(0, WLOAD);
    ROUNDS8(8, WLOAD);
    ROUNDS8(16, WSCHED);
    ROUNDS8(24, WSCHED);
    ROUNDS8(32, WSCHED);
    ROUNDS8(40, WSCHED);
    ROUNDS8(48, WSCHED);
    ROUNDS8(56, WSCHED);
    state[0] += a;
    state[1] += b;
    state[2] += c;
    state[3] += d;
    state[4] += e;
    state[5] += f;
    state[6] += g;
    state[7] += h;
    block += 64;
  }
}

void rlk_sha256_init(rlk_sha256 *ctx) {
  static const uint32_t H0[8] = {0x6a09e667u, 0xbb67ae85u, 0x3c6ef372u, 0xa54ff53au,
                                 0x510e527fu, 0x9b05688cu, 0x1f83d9abu, 0x5be0cd19u};
  memcpy(ctx->state, H0, sizeof H0);
  ctx->length = 0;
  ctx->fill = 0;
}

void rlk_sha256_update(rlk_sha256 *ctx, const void *data, size_t size) {
  const uint8_t *p = data;
  if (size == 0) return;
  ctx->length += size;
  if (ctx->fill) {
    size_t take = 64 - ctx->fill;
    if (take > size) take = size;
    memcpy(ctx->block + ctx->fill, p, take);
    ctx->fill += take;
    p += take;
    size -= take;
    if (ctx->fill < 64) return;
    compress(ctx->state, ctx->block, 1);
    ctx->fill = 0;
  }
  if (size >= 64) {
    /* Whole blocks straight from the caller's buffer, no copy. */
    compress(ctx->state, p, size / 64);
    p += size & ~(size_t)63;
    size &= 63;
  }
  if (size) {
    memcpy(ctx->block, p, size);
    ctx->fill = size;
  }
}

void rlk_sha256_final(rlk_sha256 *ctx, uint8_t digest[32]) {
  uint64_t bits = ctx->length * 8;
  ctx->block[ctx->fill++] = 0x80;
  if (ctx->fill > 56) {
    memset(ctx->block + ctx->fill, 0, 64 - ctx->fill);
    compress(ctx->state, ctx->block, 1);
    ctx->fill = 0;
  }
  memset(ctx->block + ctx->fill, 0, 56 - ctx->fill);
  store_be32(ctx->block + 56, (uint32_t)(bits >> 32));
  store_be32(ctx->block + 60, (uint32_t)bits);
  compress(ctx->state, ctx->block, 1);
  for (int i = 0; i < 8; i++) store_be32(digest + 4 * i, ctx->state[i]);
  /* The context holds message-derived state; leave nothing behind. */
  memset(ctx, 0, sizeof *ctx);
}

void rlk_sha256_digest(const void *data, size_t size, uint8_t digest[32]) {
  rlk_sha256 ctx;
  rlk_sha256_init(&ctx);
  rlk_sha256_update(&ctx, data, size);
  rlk_sha256_final(&ctx, digest);
}

void rlk_sha256_hex(const uint8_t digest[32], char hex[65]) {
  static const char digits[] = "0123456789abcdef";
  for (int i = 0; i < 32; i++) {
    hex[2 * i] = digits[digest[i] >> 4];
    hex[2 * i + 1] = digits[digest[i] & 15];
  }
  hex[64] = '\0';
}
