/* fuzz_tune_db.c - the tuning database's readers on arbitrary bytes: the line parser for both
 * kinds of file (records and the pending list), rlk_tune_db_walk / rlk_tune_pending_walk on the
 * bytes as files, a context's in-memory table loaded from them (RLK_TUNE_DB), and, on one input
 * in four, rlk_tune_db_merge of the file into another database.
 *
 * Input: one byte of flags, then the file. Checks beyond the sanitizers: every record parsed
 * is written back by rlk_tune_format as a line that parses to one record, which is written
 * the same again (the format is a fixed point after one round). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "rlk.h"
#include "tune/tune_db.h"
#include "tune/tune_table.h"

static char db[1100], pending[1200], merged[1100];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  setenv("RLK_TUNE", "use", 1);
  snprintf(db, sizeof db, "%s/tune.db", fz_scratch());
  snprintf(pending, sizeof pending, "%s" RLK_TUNE_PENDING_SUFFIX, db);
  snprintf(merged, sizeof merged, "%s/merged.db", fz_scratch());
  setenv("RLK_TUNE_DB", db, 1);
  return 0;
}

/* One record written as a file of `kind`; a malloc'd text. */
static char *format_one(const rlk_tune_record *r, rlk_tune_file_kind kind, size_t *len) {
  char *text = NULL;
  FILE *f = open_memstream(&text, len);
  if (!f) fz_fail("open_memstream", "out of memory");
  fprintf(f, "%s\n", kind == RLK_TUNE_FILE_DB ? RLK_TUNE_DB_VERSION_LINE : RLK_TUNE_PENDING_VERSION_LINE);
  if (rlk_tune_format(f, r, kind) != 0) fz_fail("rlk_tune_format", "write error on a memory stream");
  fclose(f);
  return text;
}

static void check_round_trip(const rlk_tune_record *r, rlk_tune_file_kind kind) {
  size_t len1 = 0, len2 = 0, bad = 0;
  char *first = format_one(r, kind, &len1);
  char *copy = malloc(len1 + 1);
  memcpy(copy, first, len1 + 1);
  rlk_tune_list again = {0};
  char why[256];
  if (rlk_tune_parse(copy, len1, kind, &again, &bad, why, sizeof why) != 0 || again.n != 1 || bad)
    fz_fail("rlk_tune_format", "a record's line does not parse back to one record");
  char *second = format_one(&again.v[0], kind, &len2);
  if (len1 != len2 || memcmp(first, second, len1)) fz_fail("rlk_tune_format", "a record changes on a second round");
  free(second);
  rlk_tune_list_free(&again);
  free(copy);
  free(first);
}

static int count(const rlk_tune_record *r, void *user) {
  (void)r;
  ++*(size_t *)user;
  return 0;
}

/* The table a context of the first record's environment loads from the file. */
static void lookups(const rlk_tune_list *records) {
  if (!records->n) return;
  const rlk_tune_record *r0 = &records->v[0];
  rlk_device_info info;
  memset(&info, 0, sizeof info);
  snprintf(info.name, sizeof info.name, "%s", r0->device[0] ? r0->device : "cpu");
  snprintf(info.target, sizeof info.target, "%s", r0->target[0] ? r0->target : "host");
  snprintf(info.compiler, sizeof info.compiler, "%s", r0->compiler[0] ? r0->compiler : "clang");
  info.multiprocessors = r0->multiprocessors;
  rlk_tune_table *t = NULL;
  if (fz_checked(rlk_tune_table_create(&info, &t), "rlk_tune_table_create") != RLK_OK) return;
  for (size_t i = 0; i < records->n && i < 8; i++) {
    const rlk_tune_entry *e = rlk_tune_table_find(t, records->v[i].op, records->v[i].shape, records->v[i].tokens);
    if (e && !rlk_tune_entry_settings(e)) fz_fail("rlk_tune_table_find", "an entry without settings");
  }
  uint64_t hits = 0, misses = 0;
  rlk_tune_table_counts(t, &hits, &misses);
  rlk_tune_table_destroy(t);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0], *body = data + 1;
  const size_t len = size - 1;
  char why[256];

  rlk_tune_list records = {0};
  for (int k = 0; k < 2; k++) {
    const rlk_tune_file_kind kind = k ? RLK_TUNE_FILE_PENDING : RLK_TUNE_FILE_DB;
    char *text = fz_text(body, len);
    rlk_tune_list list = {0};
    size_t bad = 0;
    if (rlk_tune_parse(text, len, kind, &list, &bad, why, sizeof why) == 0)
      for (size_t i = 0; i < list.n; i++) check_round_trip(&list.v[i], kind);
    if (kind == RLK_TUNE_FILE_DB) records = list;
    else rlk_tune_list_free(&list);
    free(text);
  }

  if (fz_write_file(db, body, len) != 0 || fz_write_file(pending, body, len) != 0)
    fz_fail("fuzz_tune_db", "cannot write the scratch files");
  size_t n = 0, bad = 0;
  if (fz_checked(rlk_tune_db_walk(db, count, &n, &bad), "rlk_tune_db_walk") == RLK_OK && n != records.n)
    fz_fail("rlk_tune_db_walk", "visits another number of records than the file parses to");
  n = 0;
  fz_checked(rlk_tune_pending_walk(db, count, &n, &bad), "rlk_tune_pending_walk");
  lookups(&records);

  if ((flags & 3) == 0) {
    remove(merged);
    size_t taken = 0;
    if (fz_checked(rlk_tune_db_merge(merged, db, &taken), "rlk_tune_db_merge") == RLK_OK) {
      n = 0;
      if (fz_checked(rlk_tune_db_walk(merged, count, &n, &bad), "rlk_tune_db_walk") == RLK_OK && n > records.n)
        fz_fail("rlk_tune_db_merge", "the merged database holds more records than its source");
    }
  }
  rlk_tune_list_free(&records);
  return 0;
}
