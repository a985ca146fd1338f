/* fuzz_record.c - RLK_JIT_RECORD as a hostile user could set it up: whatever stands at the
 * record path (nothing, a file of any bytes, one others may write, a link to another file, a
 * dangling link, a FIFO, a directory, a second name of another file), then configuration lines
 * recorded through rlk_record_op.
 *
 * Input: a byte for what stands at the path, a byte for how many lines are recorded (each then a
 * byte choosing an op and one of its sample lines), the rest the file's bytes where there is a
 * file. Checks beyond the sanitizers: no call blocks or fails; another file (a link's or a hard
 * link's target) never changes; a file others may write never changes; a file of this user only
 * grows, keeps what it held, and ends up holding each recorded line as a whole line exactly as
 * often as before, or once where it held none. */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/core.h"
#include "fuzz.h"
#include "rlk.h"
#include "ops/ops.h"
#include "runtime/catalog.h"
#include "runtime/op.h"
#include "runtime/record.h"

#define MAX_LINES 12

static char path[1100], victim[1100];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  fz_init(argc, argv);
  snprintf(path, sizeof path, "%s/record.conf", fz_scratch());
  snprintf(victim, sizeof victim, "%s/victim", fz_scratch());
  return 0;
}

static char *read_file(const char *p, size_t *n) {
  *n = 0;
  FILE *f = fopen(p, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char *buf = malloc(cap + 1);
  size_t got;
  while ((got = fread(buf + len, 1, cap - len, f)) > 0) {
    len += got;
    if (len == cap) buf = realloc(buf, (cap *= 2) + 1);
  }
  fclose(f);
  buf[len] = '\0';
  *n = len;
  return buf;
}

/* Lines of text[0, n) equal to line: whole ones, and with `tail` a last one without its newline
 * (what a writer that died mid-line leaves; the record completes it). */
static int count_line(const char *text, size_t n, const char *line, int tail) {
  const size_t k = strlen(line);
  int count = 0;
  for (size_t at = 0; at < n;) {
    const char *nl = memchr(text + at, '\n', n - at);
    const size_t end = nl ? (size_t)(nl - text) : n;
    if ((nl || tail) && end - at == k && !memcmp(text + at, line, k)) count++;
    at = end + 1;
  }
  return count;
}

static rlk_op_catalog catalog = RLK_OP_CATALOG_INIT(rlk_op_table);

/* A sample configuration line of some op, parsed into values. */
static int pick_line(uint8_t choice, const rlk_op_desc **d, rlk_op_values *vals, char *line, size_t size) {
  size_t nops = 0;
  while (rlk_op_table[nops]) nops++;
  *d = rlk_op_table[choice % nops];
  size_t nsamples = 0;
  while ((*d)->samples && (*d)->samples[nsamples]) nsamples++;
  if (!nsamples) return -1;
  const char *sample = (*d)->samples[(choice / nops) % nsamples];
  char *copy = NULL;
  const rlk_op_desc *op = NULL;
  rlk_op_config_pair pairs[RLK_OP_CONFIG_MAX_PAIRS];
  size_t npairs = 0;
  int rc = -1;
  if (rlk_op_config_parse("fuzz", &catalog, sample, &copy, &op, pairs, &npairs) == RLK_OK && op == *d &&
      rlk_op_values_parse(op, npairs, pairs, vals) == RLK_OK && rlk_op_values_line(op, vals, line, size) >= 0)
    rc = 0;
  free(copy);
  rlk_error_clear();
  return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  fz_input in = {data, size};
  const int kind = fz_u8(&in) % 9;
  int nlines = fz_u8(&in) % (MAX_LINES + 1);
  const rlk_op_desc *ops[MAX_LINES];
  rlk_op_values vals[MAX_LINES];
  char lines[MAX_LINES][1024];
  int n = 0;
  for (int i = 0; i < nlines; i++)
    if (pick_line(fz_u8(&in), &ops[n], &vals[n], lines[n], sizeof lines[n]) == 0) n++;
  nlines = n;

  unlink(path);
  rmdir(path);
  unlink(victim);
  static const uint8_t precious[] = "precious\n";
  fz_write_file(victim, precious, sizeof precious - 1);
  chmod(victim, 0600);
  switch (kind) {
  case 0: break;                                                      /* nothing: created */
  case 1: fz_write_file(path, in.p, in.n), chmod(path, 0600); break; /* this user's file */
  case 2: fz_write_file(path, in.p, in.n), chmod(path, 0666); break; /* world-writable */
  case 3: symlink(victim, path); break;                               /* a link to another file */
  case 4: mkfifo(path, 0600); break;
  case 5: mkdir(path, 0700); break;
  case 6: link(victim, path); break;                                  /* a second name */
  case 7: symlink("/nonexistent/rlk-fuzz", path); break;              /* dangling */
  default: fz_write_file(path, in.p, in.n), chmod(path, 0640); break; /* group-readable */
  }
  size_t before_n = 0;
  char *before = (kind == 1 || kind == 2 || kind == 8) ? read_file(path, &before_n) : NULL;

  rlk_record_reset(path);
  for (int i = 0; i < nlines; i++) rlk_record_op(ops[i], &vals[i]);
  rlk_record_reset(NULL);

  size_t vn = 0;
  char *v = read_file(victim, &vn);
  if (!v || vn != sizeof precious - 1 || memcmp(v, precious, vn)) fz_fail("record", "another file changed");
  free(v);
  if (kind == 7 && access("/nonexistent/rlk-fuzz", F_OK) == 0) fz_fail("record", "created through a link");
  if (before) {
    size_t after_n = 0;
    char *after = read_file(path, &after_n);
    if (!after || after_n < before_n || memcmp(after, before, before_n))
      fz_fail("record", "the file lost or changed what it held");
    if (kind == 2 && after_n != before_n) fz_fail("record", "a world-writable file was written");
    if (kind != 2)
      for (int i = 0; i < nlines; i++) {
        const int was = count_line(before, before_n, lines[i], 1), now = count_line(after, after_n, lines[i], 0);
        if (now != (was ? was : 1)) {
          char why[1200];
          snprintf(why, sizeof why, "'%s' held %d times, now %d", lines[i], was, now);
          fz_fail("record", why);
        }
      }
    free(after);
  }
  free(before);
  unlink(path);
  rmdir(path);
  return 0;
}
