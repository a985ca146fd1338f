/* cache_internal.h - what the files of the cache's store share (cache.c, cache_entry.c,
 * cache_tree.c, cache_scan.c, cache_trust.c, cache_lock.c), and the tree operations the
 * administration above the store uses (runtime/cache_admin.c): the cache handle, an entry's
 * format and check, and tolerant, link-safe operations on a tree. Nothing else includes this
 * (tests and fuzzers aside). */
#ifndef RLK_CACHE_INTERNAL_H
#define RLK_CACHE_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/types.h>

#include "jit/cache.h"
#include "jit/key.h"

#define RLK_CACHE_META_NAME "kernel.meta"     /* the commit marker */
#define RLK_CACHE_LAST_USED_NAME "last_used"  /* its mtime is the entry's recency */
#define RLK_CACHE_META_FORMAT "rlk-cache-1"
#define RLK_CACHE_TMP_DIR "tmp"               /* staging, under the root */
#define RLK_CACHE_QUARANTINE_DIR "quarantine" /* damaged entries, under the root */
#define RLK_CACHE_LOG_HEAD 2048               /* bytes of the compiler log kept */
#define RLK_CACHE_TOUCH_INTERVAL 3600         /* last_used is refreshed at most this often (s) */
#define RLK_CACHE_STAGING_MAX_AGE 3600        /* older staging dirs are abandoned (s) */
#define RLK_CACHE_QUARANTINE_MAX_AGE 86400    /* quarantined entries are kept this long (s) */
#define RLK_CACHE_PUBLISH_GRACE 60            /* see rlk_cache_publish's eviction (s) */
#define RLK_CACHE_PATH_MAX 4096
#define RLK_CACHE_BINARY_MAX ((size_t)1 << 30) /* the largest binary an entry may hold */
#define RLK_CACHE_MARKER_NAME "CACHEDIR.TAG"      /* marks a writable root as the cache's own */
#define RLK_CACHE_MARKER_ID "rlk-cache-root 1"

struct rlk_cache {
  rlk_cache_config cfg;
  rlk_cache_mode mode;   /* effective */
  char root[1024];       /* writable root, "" unless mode is RW */
  char read_root[1024];  /* the root read after the read-only trees ("" if none) */
  char **ro;             /* read-only trees, in search order */
  size_t nro;
  _Atomic int lock_state; /* 0: lock dir unchecked, 1: usable, -1: unusable (warned once) */
  /* Read-only entries this process has refused (damaged, untrusted, or not loadable by the
   * backend): later lookups pass over them silently to the next tree, where a rebuilt copy
   * is found. Paths, malloc'd; guarded by refused_lock. */
  pthread_mutex_t refused_lock;
  char **refused;
  size_t nrefused, refused_cap;
};

/* ---- an entry (cache_entry.c) ---- */

/* The parsed kernel.meta of an entry. */
typedef struct rlk_cache_meta {
  rlk_kernel_key key;     /* the recorded fields; hash/hex recomputed from them */
  char recorded_hex[65];  /* the "key" line */
  char binary[64];        /* the binary's file name */
  uint64_t binary_size;
  char binary_sha256[65];
  char **lowered;         /* malloc'd */
  size_t nlowered;
  double compile_seconds;
  int64_t created;        /* unix seconds, 0 if unknown */
} rlk_cache_meta;

void rlk_cache_meta_free(rlk_cache_meta *meta);

/* Parses kernel.meta text (modified in place). Returns 0, or -1 with the reason in `why`. */
int rlk_cache_meta_parse(char *text, size_t len, rlk_cache_meta *meta, char *why, size_t whysize);

/* The kernel.meta text of an entry of key `key` (finished) holding `binary` under the file name
 * `binary_name`: every key field, the binary's size and SHA-256, the lowered names, the head of
 * the compiler log and who created it. malloc'd, its length in *len; NULL when out of memory. */
char *rlk_cache_meta_text(const rlk_kernel_key *key, const char *binary_name, const void *binary, size_t size,
                          char *const *names, size_t nnames, const rlk_cache_publish_info *info, size_t *len);

/* Reads and parses the kernel.meta of the entry open as `dfd` (no binary check). 0 or -1. */
int rlk_cache_read_meta(int dfd, rlk_cache_meta *meta, char *why, size_t whysize);

/* Checks the entry directory open as `dfd`, named `hash`: its metadata parses, the recorded
 * key fields hash to `hash` (and equal `expect`'s when given), and the binary has the recorded
 * size and SHA-256. Its files must be regular files (never links, FIFOs or devices); with
 * `trusted_only` they must also pass rlk_fs_untrusted. On success fills `meta` (caller
 * frees) and, when `binary` is not NULL, hands over the bytes. Returns 0, or -1 with the
 * reason in `why` (meta then holds nothing). */
int rlk_cache_entry_check(int dfd, const char *hash, const rlk_kernel_key *expect, int trusted_only,
                          rlk_cache_meta *meta, void **binary, char *why, size_t whysize);

/* 1 if s can name an entry's binary: a plain file name, never one of the entry's own files. */
int rlk_cache_valid_binary_name(const char *s);

/* <root>/v<schema>/<compiler>/<target>/<family>/<hh>/<hex> of a finished key; -1 if too long. */
int rlk_cache_entry_path(const char *root, const rlk_kernel_key *key, char *buf, size_t size);

/* src as one path component of the layout: characters other than letters, digits and ".-_+"
 * become '_', and never "", "." or a hidden name (the prefix is for people, the hash decides). */
void rlk_cache_name_component(char *dst, size_t size, const char *src);

/* Recency of an entry: mtime of last_used, else of kernel.meta, else of the directory. */
int64_t rlk_cache_entry_last_used(int dfd);

/* Writes a new file `name` in the directory open as dfd (never through a link) and fsyncs it.
 * 0 or -1 with errno. */
int rlk_cache_write_file_at(int dfd, const char *name, const void *data, size_t size);

/* ---- trust (cache_trust.c) ---- */

/* A directory or file of a cache tree is trusted to hold code this process runs when it passes
 * rlk_fs_untrusted (core/fs.h). */

/* Opens a tree's root (links in the given path are followed: the user named it) and checks it
 * is trusted. fd, or -1 with the reason in `why` (errno ENOENT when it does not exist). */
int rlk_cache_open_tree(const char *root, char *why, size_t whysize);

/* Opens the directory `name` below `parent` without following a link, and checks it is
 * trusted. `shown` names it in `why`. fd, or -1 (errno ENOENT: missing; ENOTDIR: a file or a
 * link is in the way; EPERM: untrusted). */
int rlk_cache_open_dir_at(int parent, const char *name, const char *shown, char *why,
                          size_t whysize);

/* 1 if the root open as `rootfd` is the cache's own: it carries the marker (written when the
 * cache first used the root, empty), or it is empty (then, with `claim`, the marker is written).
 * 0 otherwise, with why: names that merely look like the cache's are no proof. Nothing is ever
 * deleted from, or published into, a root that is not the cache's own. */
int rlk_cache_root_is_own(int rootfd, int claim, char *why, size_t whysize);

/* Opens (with `create`, making it 0700 first; a file or link in its way is removed) one of
 * the cache's own directories at a root: tmp or quarantine. Never follows a link. fd or -1. */
int rlk_cache_open_own_subdir(int rootfd, const char *name, int create);

/* Names the runtime creates in tmp/ (<host>-<pid>-XXXXXX, probe-XXXXXX) and quarantine/
 * (<hash>.<time>.<pid>): the only names it ever deletes there. */
int rlk_cache_is_staging_name(const char *s);
int rlk_cache_is_quarantine_name(const char *s);

/* 1 if s is 64 lower-case hex digits. */
int rlk_cache_is_hash(const char *s);

/* ---- changing a tree (cache_tree.c) ---- */

/* Creates the root (when writable) and checks it can be trusted and, when writable, that it is
 * the cache's own (its marker, written into a new or empty root) and can be written. Executable
 * code is loaded from it: anyone who can write there can run code in this process. 0, or -1
 * with why. */
int rlk_cache_prepare_root(const char *root, int writable, char *why, size_t whysize);

/* Removes a tree without following links; vanished files, busy NFS files and directories
 * refilled meanwhile are not errors. 0, or -1 if something could not be removed. */
int rlk_cache_rmtree(const char *path);

/* rlk_cache_rmtree of `name` relative to the directory open as dirfd. */
int rlk_cache_rmtree_at(int dirfd, const char *name);

/* A unique staging directory (0700) under <root>/tmp, its path in buf; 0 or -1 with errno. */
int rlk_cache_make_staging(const char *root, char *buf, size_t size);

/* Removes what is older than max_age seconds (all of it when max_age < 0) among the names
 * `own` accepts in the cache's own directory `sub` (tmp or quarantine) of the root open as
 * rootfd, never through a link; with max_age < 0 the emptied directory goes too. `root` is for
 * messages. The caller has checked the root is the cache's own (rlk_cache_root_is_own). */
void rlk_cache_sweep_own(int rootfd, const char *root, const char *sub, int64_t max_age,
                         int (*own)(const char *));

/* Takes an entry out of the tree atomically (renamed into staging) and removes it, so a
 * reader sees the whole entry or none. 0 or -1. */
int rlk_cache_retire(const char *root, const char *entry_path);

/* Moves a damaged entry to <root>/quarantine/<hash>.<time>.<pid> (removing it if that fails).
 * 0, or -1 if it is still in place. */
int rlk_cache_quarantine_path(const char *root, const char *entry_path);

/* Removes staging dirs older than RLK_CACHE_STAGING_MAX_AGE and quarantined entries older
 * than RLK_CACHE_QUARANTINE_MAX_AGE: only names the runtime creates, never through a link, and
 * only at a root that is the cache's own (rlk_cache_root_is_own). */
void rlk_cache_sweep(const char *root);

/* ---- a tree's entries (cache_scan.c) ---- */

/* Where an entry directory was found: its path and the layout components leading to it. */
typedef struct rlk_cache_scan_pos {
  char path[RLK_CACHE_PATH_MAX];
  const char *part[7]; /* v<n>, compiler, target, family, hh, hash (pointers into path) */
  uint64_t unreadable;                /* directories of the layout that could not be read */
  int unreadable_errno;               /* the first one's error ... */
  char unreadable_path[RLK_CACHE_PATH_MAX]; /* ... and path */
} rlk_cache_scan_pos;

/* Return non-zero to stop the scan. */
typedef int (*rlk_cache_scan_fn)(const rlk_cache_scan_pos *pos, void *user);

/* Visits every <hash> directory of the layout under root (schema < 0: of every schema
 * directory), never through a link. RLK_OK also when the root does not exist; RLK_ERR_IO, after
 * visiting the rest, when a directory of the layout could not be read (what it holds was not
 * visited). */
rlk_status rlk_cache_scan(const char *root, int schema, rlk_cache_scan_fn fn, void *user);

/* Size (regular files, apparent bytes), recency and commit state of an entry directory. 0 or -1. */
int rlk_cache_entry_stats(const char *path, uint64_t *bytes, int64_t *last_used, int *committed);

/* Removes entries of a tree (every schema), least recently used first: each unused for more than
 * max_age seconds (0: none by age), then more while the tree holds over max_bytes (0: no cap),
 * sparing entries used within `grace` seconds and `keep` (an entry path; may be NULL). Counts
 * what it removed, and in *failed (may be NULL) the entries that could not be removed. */
rlk_status rlk_cache_evict_tree(const char *root, uint64_t max_bytes, int64_t max_age, int64_t grace,
                                const char *keep, uint64_t *removed_entries, uint64_t *removed_bytes,
                                uint64_t *failed);

/* Removes the empty directories of the layout (v<n>/... down to <hh>) under root, bottom up;
 * a directory that still holds anything stays. */
void rlk_cache_remove_empty_layout(const char *root);

#endif
