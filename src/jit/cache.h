/* cache.h - the on-disk kernel cache (docs/cache.md).
 *
 * Layout: <root>/v<schema>/<compiler-id>/<target>/<family>/<hh>/<hash>/{kernel.<ext>, kernel.meta}
 * kernel.meta is the commit marker. Read-only trees are searched before the writable one.
 * Publishing stages into <root>/tmp/<host>-<pid>-<rand>/, fsyncs and renames into place.
 * The cache knows keys and bytes, nothing of ops or compilers. */
#ifndef RLK_CACHE_H
#define RLK_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "jit/key.h"
#include "rlk.h"

typedef enum rlk_cache_mode {
  RLK_CACHE_MODE_RW = 0,     /* read-only trees, then the writable tree; publish there */
  RLK_CACHE_MODE_RO = 1,     /* read every tree, never write */
  RLK_CACHE_MODE_MEMORY = 2, /* read-only trees only; compiles stay in memory */
  RLK_CACHE_MODE_OFF = 3     /* no disk at all */
} rlk_cache_mode;

typedef struct rlk_cache_config {
  char root[1024];        /* writable root */
  char ro_dirs[4096];     /* colon-separated read-only roots */
  rlk_cache_mode mode;
  uint64_t max_bytes;     /* 0: no cap */
  char lock_dir[1024];
  double lock_timeout_s;
} rlk_cache_config;

/* Fills a config from the environment (RLK_CACHE_DIR, RLK_CACHE_RO_DIRS, RLK_CACHE_MODE,
 * RLK_CACHE_MAX_BYTES, RLK_LOCK_DIR, RLK_LOCK_TIMEOUT_S); `root_override` (may be NULL)
 * takes precedence over RLK_CACHE_DIR. */
rlk_status rlk_cache_config_from_env(rlk_cache_config *cfg, const char *root_override);

typedef struct rlk_cache rlk_cache;

/* Opens the cache. A writable root that cannot be created or written degrades the cache to
 * memory mode with one warning; a world-writable root (without the sticky bit), or one owned
 * by another user, is refused: the cache then runs in memory mode and the warning says why.
 * Fails only on allocation failure or a malformed config. */
rlk_status rlk_cache_open(const rlk_cache_config *cfg, rlk_cache **out);
void rlk_cache_close(rlk_cache *cache);

/* The writable root in use, or "" when nothing is written. */
const char *rlk_cache_root(const rlk_cache *cache);
rlk_cache_mode rlk_cache_effective_mode(const rlk_cache *cache);

/* What an entry holds besides its key. */
typedef struct rlk_cache_blob {
  void *binary;           /* malloc'd */
  size_t size;
  char **lowered_names;   /* malloc'd, nnames of them */
  size_t nnames;
  char path[1024];        /* the entry directory it came from ("" if none) */
  int read_only;          /* from a read-only tree */
} rlk_cache_blob;

void rlk_cache_blob_free(rlk_cache_blob *blob);

/* Looks the key up in the read-only trees, then the writable tree. Sets *found. Every
 * directory from a tree's root to the entry, and the entry's files, must be trusted
 * (cache_internal.h: rlk_fs_untrusted; never a link below the root); an untrusted path is
 * passed over with one warning. An entry whose metadata does not match the key, or whose
 * binary fails its checksum or is truncated, is quarantined (writable tree) or passed over
 * from then on (read-only tree), with one warning, and *rebuilt is incremented once (may be
 * NULL). A hit refreshes last_used at most once an hour. */
rlk_status rlk_cache_lookup(rlk_cache *cache, const rlk_kernel_key *key, rlk_cache_blob *out,
                            int *found, int *rebuilt);

/* Metadata recorded with a published entry. */
typedef struct rlk_cache_publish_info {
  const char *binary_name;  /* "kernel.cubin" */
  double compile_seconds;
  const char *log;          /* compiler log; its head is kept */
} rlk_cache_publish_info;

/* Publishes binary + lowered names under the key in the writable tree (no-op in other
 * modes). Losing a rename race to another writer is success. Enforces max_bytes afterwards. */
rlk_status rlk_cache_publish(rlk_cache *cache, const rlk_kernel_key *key, const void *binary,
                             size_t size, char *const *lowered_names, size_t nnames,
                             const rlk_cache_publish_info *info);

/* Puts an entry the backend refused out of the way: an entry of the writable tree is
 * quarantined; one of a read-only tree is left in place but passed over by this cache's later
 * lookups. Either way the next lookup goes on to the next tree (where a rebuilt copy may
 * already be), and the kernel is rebuilt if no tree holds it. */
rlk_status rlk_cache_quarantine(rlk_cache *cache, const char *entry_path);

/* A per-key node-local advisory lock (RLK_LOCK_DIR, default /dev/shm/rlk-<uid> or /tmp/rlk-<uid>).
 * Waits up to the configured timeout, then RLK_ERR_TIMEOUT naming the lock file. */
typedef struct rlk_cache_lock rlk_cache_lock;
rlk_status rlk_cache_lock_acquire(rlk_cache *cache, const rlk_kernel_key *key,
                                  rlk_cache_lock **out);
void rlk_cache_lock_release(rlk_cache_lock *lock);

/* Evicts whole entries of a writable tree, oldest last_used first, skipping entries younger
 * than `grace_seconds`, until the tree holds at most max_bytes. */
rlk_status rlk_cache_evict(const char *root, uint64_t max_bytes, int64_t grace_seconds,
                           uint64_t *removed_entries, uint64_t *removed_bytes);

#endif
