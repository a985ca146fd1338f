/* tune_db.h - the tuning database's records as text (format 1), and its files: reading,
 * the advisory lock, atomic replacement and the pending list. Internal; the public side is the
 * "Tuning database" section of rlk.h.
 *
 * A database file is the line "# rlk-tune-db 1" followed by one record per line:
 *   op=logprob<TAB>shape=pass=fwd logits=bf16 ...<TAB>tokens=16384<TAB>target=sm_90a<TAB>
 *   device=NVIDIA H200<TAB>sms=132<TAB>runtime=0.1.0<TAB>compiler=nvrtc 13.0<TAB>
 *   winner=variant=bulk block=256 unroll=4 stages=3<TAB>default_ms=1.42<TAB>best_ms=1.30<TAB>
 *   created=1764400000<TAB>cand=1.31 variant=vec block=256 unroll=4<TAB>cand=rejected ...
 * Each field is name=value split at the first '='; unknown names are ignored (a later writer of
 * the same version may add some); "cand" repeats, its value the result (a median in ms,
 * "rejected" or "failed"), a space, and the candidate's settings; every other known name appears
 * once (a line that gives one twice does not parse: which value it means cannot be told). The
 * pending file "<db>.pending" starts with "# rlk-tune-pending 1" and holds key fields only. */
#ifndef RLK_TUNE_DB_H
#define RLK_TUNE_DB_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "rlk.h"

#define RLK_TUNE_DB_VERSION_LINE "# rlk-tune-db 1"
#define RLK_TUNE_PENDING_VERSION_LINE "# rlk-tune-pending 1"
#define RLK_TUNE_PENDING_SUFFIX ".pending"
#define RLK_TUNE_LOCK_SUFFIX ".lock"
#define RLK_TUNE_DB_NAME "tune.db" /* under the cache root */

/* Which kind of file a text is: a database (records with measurements) or a pending list. */
typedef enum rlk_tune_file_kind { RLK_TUNE_FILE_DB = 0, RLK_TUNE_FILE_PENDING = 1 } rlk_tune_file_kind;

/* A growable array of records. */
typedef struct rlk_tune_list {
  rlk_tune_record *v;
  size_t n, cap;
} rlk_tune_list;

/* Appends a copy of `r`; 0, or -1 when out of memory. */
int rlk_tune_list_push(rlk_tune_list *list, const rlk_tune_record *r);
void rlk_tune_list_free(rlk_tune_list *list);

/* 1 when a and b have the same key (op, shape, tokens and the environment). */
int rlk_tune_same_key(const rlk_tune_record *a, const rlk_tune_record *b);

/* A record holding only src's key fields (the measurement zeroed). */
void rlk_tune_copy_key(rlk_tune_record *dst, const rlk_tune_record *src);

/* The token bucket of n rows: 2^round(log2 n) (1 for n < 1). */
int64_t rlk_tune_bucket(int64_t n);

/* Checks a record before it is written: RLK_ERR_INVALID_ARGUMENT naming `what` and the field. */
rlk_status rlk_tune_check_record(const rlk_tune_record *r, rlk_tune_file_kind kind, const char *what);

/* Parses a file's text (modified in place). Returns 0 with the records appended to `out`, or -1
 * when the text is not a file of `kind` (its first line is not the version line; nothing is
 * appended), with the reason in `why`. *bad counts the lines skipped: those that do not parse,
 * and a last line without its newline (a truncated write). -1 also counts every line. */
int rlk_tune_parse(char *text, size_t len, rlk_tune_file_kind kind, rlk_tune_list *out, size_t *bad,
                   char *why, size_t whysize);

/* Writes one record's line, newline included. 0, or -1 on a write error. */
int rlk_tune_format(FILE *out, const rlk_tune_record *r, rlk_tune_file_kind kind);

/* ---- files (tune_file.c) ---------------------------------------------------------- */

/* Reads a file of `kind`. A missing file is empty (*exists = 0). Returns RLK_OK with its
 * records, and with *damaged set and the reason in `why` when lines were skipped or the file is
 * not of `kind` (then no record); RLK_ERR_IO when it exists but cannot be read. Never warns. */
rlk_status rlk_tune_file_read(const char *path, rlk_tune_file_kind kind, rlk_tune_list *out,
                              int *exists, size_t *bad, int *damaged, char *why, size_t whysize);

/* Takes the exclusive advisory lock beside `db` (<db>.lock): an OFD lock, flock() where those
 * are missing, waiting at most timeout_s seconds (0: one try). RLK_ERR_TIMEOUT when another
 * process held it throughout. Release with rlk_tune_unlock. */
rlk_status rlk_tune_lock(const char *db, double timeout_s, int *fd);
void rlk_tune_unlock(int fd);

/* The pending list's path for a database path. */
rlk_status rlk_tune_pending_path(const char *db, char *buf, size_t size);

/* Adds one configuration (its key fields) to the pending list of `db` unless it is there
 * already; waits for the lock at most timeout_s. Creates the file and its directory. */
rlk_status rlk_tune_pending_add(const char *db, const rlk_tune_record *key, double timeout_s);

#endif
