/* tune_table.h - a context's in-memory view of the tuning database: the records of the
 * context's environment, read from the file once (at the first lookup) and then looked up
 * without a lock or a system call. Ops consult it through their variant selection. Internal. */
#ifndef RLK_TUNE_TABLE_H
#define RLK_TUNE_TABLE_H

#include <stdint.h>

#include "rlk.h"

/* RLK_TUNE */
typedef enum rlk_tune_mode {
  RLK_TUNE_MODE_OFF = 0,  /* the database is never read */
  RLK_TUNE_MODE_USE = 1,  /* lookups consult it (default) */
  RLK_TUNE_MODE_TUNE = 2  /* and a miss joins the pending list, once per configuration */
} rlk_tune_mode;

#define RLK_TUNE_VALUES 8 /* tuning values an op may parse a winner into */

typedef struct rlk_tune_table rlk_tune_table;
typedef struct rlk_tune_entry rlk_tune_entry;

/* Reads RLK_TUNE and RLK_TUNE_DB for a context of this device; nothing is read from disk yet. */
rlk_status rlk_tune_table_create(const rlk_device_info *info, rlk_tune_table **out);
void rlk_tune_table_destroy(rlk_tune_table *table);

/* 0 when no lookup can return a record or note a miss (RLK_TUNE=off, or the database is loaded
 * with nothing for this environment and RLK_TUNE is not tune): ops skip building a key then. */
int rlk_tune_table_wanted(const rlk_tune_table *table);

/* The record of (op, shape, token bucket) in this context's environment, or NULL. The first call
 * loads the database; under RLK_TUNE=tune a miss is added to the pending list once (the only
 * file access after the load). Thread-safe; a hit takes no lock. */
const rlk_tune_entry *rlk_tune_table_find(rlk_tune_table *table, const char *op, const char *shape,
                                          int64_t tokens);

/* Lookups so far that found a record, and that found none (tests, diagnostics). */
void rlk_tune_table_counts(const rlk_tune_table *table, uint64_t *hits, uint64_t *misses);

/* The winner's settings ("" when the default won). */
const char *rlk_tune_entry_settings(const rlk_tune_entry *entry);

/* Turns settings into an op's tuning values; 0, or -1 when it cannot. */
typedef int (*rlk_tune_parse_fn)(const char *settings, int64_t values[RLK_TUNE_VALUES]);

/* The entry's settings as `parse` reads them, parsed once and kept: 0 with the values, or -1
 * when they do not parse. One op parses an entry (entries are keyed by op). */
int rlk_tune_entry_values(rlk_tune_table *table, const rlk_tune_entry *entry, rlk_tune_parse_fn parse,
                          int64_t values[RLK_TUNE_VALUES]);

/* 1 the first time it is called for an entry, 0 after: an op warns once about settings it
 * cannot use. */
int rlk_tune_entry_first_warning(const rlk_tune_entry *entry);

#endif
