/* test_record.c - RLK_JIT_RECORD as another user or process could abuse it: a link or a file
 * that is not this user's at the record path, a lock held by a reader, a FIFO, a record file
 * larger than any buffer. Each run records in a child process of its own (a process reads
 * RLK_JIT_RECORD once), with its stderr kept for the warnings. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <check.h>

#include "rlk.h"
#include "suites.h"
#include "test_util.h"

#define NOBODY_UID 65534

/* One group_advantage call per mode (each a configuration line of its own) on a host context. */
static void call_modes(const char *const *modes) {
  rlk_context *ctx = rlk_test_host_context();
  float scores[4] = {1, 2, 4, 3}, adv[4];
  for (int i = 0; modes[i]; i++) {
    rlk_group_advantage_args a;
    rlk_group_advantage_args_init(&a);
    a.scores = rlk_tensor_1d(scores, RLK_F32, 4);
    a.advantages = rlk_tensor_1d(adv, RLK_F32, 4);
    a.group_size = 2;
    if (!strcmp(modes[i], "rloo")) a.mode = RLK_ADV_RLOO;
    else if (!strcmp(modes[i], "mean-only")) a.mode = RLK_ADV_MEAN_ONLY;
    else if (!strcmp(modes[i], "batch-std")) a.mode = RLK_ADV_BATCH_STD;
    rlk_status st = rlk_group_advantage(ctx, &a, NULL);
    ck_assert_msg(st == RLK_OK, "group_advantage %s: %s", modes[i], rlk_last_error());
    ck_assert_msg(rlk_last_error()[0] == '\0', "a recording problem leaked into the call: %s", rlk_last_error());
  }
  rlk_context_destroy(ctx);
}

typedef struct child_run {
  int status;    /* exit status, 128 + signal */
  double seconds;
  char err[8192]; /* what it wrote to stderr */
} child_run;

/* Runs call_modes(modes) in a child with RLK_JIT_RECORD=path, which then exits normally. */
static child_run record_in_child(const char *path, const char *const *modes) {
  char errpath[1100];
  snprintf(errpath, sizeof errpath, "%s/stderr-XXXXXX", rlk_test_tmpdir());
  int efd = mkstemp(errpath);
  ck_assert_int_ge(efd, 0);
  double t0 = rlk_test_now();
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    dup2(efd, 2);
    setenv("RLK_JIT_RECORD", path, 1);
    setenv("RLK_LOG", "warn", 1);
    call_modes(modes);
    exit(0); /* exit, not _exit: the library's exit handlers run */
  }
  child_run r;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.seconds = rlk_test_now() - t0;
  r.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  ssize_t n = pread(efd, r.err, sizeof r.err - 1, 0);
  r.err[n > 0 ? n : 0] = '\0';
  close(efd);
  unlink(errpath);
  return r;
}

#define MODES(...) ((const char *const[]){__VA_ARGS__, NULL})

static char *read_all(const char *path, size_t *size) {
  FILE *f = fopen(path, "rb");
  if (!f) {
    *size = 0;
    return NULL;
  }
  fseek(f, 0, SEEK_END);
  long n = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *buf = malloc((size_t)n + 1);
  ck_assert_ptr_nonnull(buf);
  ck_assert_int_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
  buf[n] = '\0';
  fclose(f);
  *size = (size_t)n;
  return buf;
}

static void write_text(const char *path, const char *text, mode_t mode) {
  int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
  ck_assert_msg(fd >= 0, "%s: %s", path, strerror(errno));
  ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
  close(fd);
  chmod(path, mode);
}

/* The run succeeded, warned once about the record path, and recorded nothing. */
static void expect_refused(const child_run *r, const char *what, const char *reason) {
  ck_assert_msg(r->status == 0, "%s: the run failed (%d):\n%s", what, r->status, r->err);
  ck_assert_msg(rlk_test_count_lines(r->err, "RLK_JIT_RECORD") == 1, "%s: not one warning:\n%s", what, r->err);
  ck_assert_msg(strstr(r->err, reason) != NULL, "%s: the warning does not say '%s':\n%s", what, reason, r->err);
}

static int skip_unless_root(const char *what) {
  if (geteuid() == 0) return 0;
  printf("skip (record: %s): needs root, to stand for two users\n", what);
  return 1;
}

static int fork_ok(void) {
  const char *fork_env = getenv("CK_FORK");
  if (fork_env && !strcmp(fork_env, "no")) {
    printf("skip (record): each run needs a process of its own; CK_FORK=no\n");
    return 0;
  }
  return 1;
}

/* A new directory for a record case and the record path in it (record.conf); 0 when the case
 * cannot run here (fork_ok). */
static int record_dir(char *dir, size_t dir_size, char *path, size_t path_size, const char *stem) {
  if (!fork_ok()) return 0;
  rlk_test_mkdtemp(dir, dir_size, stem);
  snprintf(path, path_size, "%s/record.conf", dir);
  return 1;
}

/* The file a run writes lines to: one per configuration, whatever the number of runs. */
START_TEST(record_appends_each_configuration_once) {
  char dir[1024], path[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-once")) return;
  child_run r = record_in_child(path, MODES("grpo", "rloo", "grpo"));
  ck_assert_msg(r.status == 0 && r.err[0] == '\0', "%d:\n%s", r.status, r.err);
  r = record_in_child(path, MODES("rloo", "grpo", "mean-only"));
  ck_assert_msg(r.status == 0 && r.err[0] == '\0', "%d:\n%s", r.status, r.err);
  size_t n;
  char *text = read_all(path, &n);
  ck_assert_int_eq(rlk_test_count_lines(text, "group_advantage"), 3);
  ck_assert_int_eq(rlk_test_count_lines(text, "mode=rloo"), 1);
  ck_assert_int_eq(rlk_test_count_lines(text, "mode=mean-only"), 1);
  /* Made for this user alone: another user cannot read it, so cannot lock it either. */
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_mode & 077, 0);
  free(text);
  rlk_test_rmtree(dir);
}
END_TEST

/* A shape hint the op reads only through its tuning bucket (logprob's rows, new every step of a
 * trainer) is recorded as the bucket: rows 100 to 130 are one line (128), rows 1000 another. */
START_TEST(record_writes_hints_as_their_buckets) {
  char dir[1024], path[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-rows")) return;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("RLK_JIT_RECORD", path, 1);
    rlk_context *ctx = rlk_test_host_context();
    enum { V = 64, NMAX = 1000 };
    static float logits[NMAX * V], logp[NMAX];
    static int64_t labels[NMAX];
    for (int i = 0; i < NMAX * V; i++) logits[i] = (float)(i % 7) * 0.25f;
    for (int n = 100; n <= 131; n++) {
      rlk_logprob_args a;
      rlk_logprob_args_init(&a);
      a.logits = rlk_tensor_2d(logits, RLK_F32, n == 131 ? NMAX : n, V, V);
      a.labels = rlk_tensor_1d(labels, RLK_I64, n == 131 ? NMAX : n);
      a.logp = rlk_tensor_1d(logp, RLK_F32, n == 131 ? NMAX : n);
      if (rlk_logprob(ctx, &a, NULL) != RLK_OK) _exit(1);
    }
    rlk_context_destroy(ctx);
    exit(0); /* the library's exit handlers write what is queued */
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  size_t n;
  char *text = read_all(path, &n);
  ck_assert_msg(text && rlk_test_count_lines(text, "logprob") == 2, "%s", text ? text : "(no file)");
  ck_assert_msg(strstr(text, "tokens=128 ") && strstr(text, "tokens=1024 "), "%s", text);
  free(text);
  rlk_test_rmtree(dir);
}
END_TEST

/* A variant that RLK_LOGPROB_VARIANT forces on a call that asked for auto is in the recorded
 * line, so that precompiling the line without the variable builds the kernel the call ran. */
START_TEST(record_names_the_variant_the_environment_forced) {
  char dir[1024], path[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-variant")) return;
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("RLK_JIT_RECORD", path, 1);
    setenv("RLK_LOGPROB_VARIANT", "bulk", 1);
    rlk_context *ctx = rlk_test_host_context();
    enum { V = 64, N = 4 };
    static float logits[N * V], logp[N];
    static int64_t labels[N];
    rlk_logprob_args a;
    rlk_logprob_args_init(&a);
    a.logits = rlk_tensor_2d(logits, RLK_F32, N, V, V);
    a.labels = rlk_tensor_1d(labels, RLK_I64, N);
    a.logp = rlk_tensor_1d(logp, RLK_F32, N);
    if (rlk_logprob(ctx, &a, NULL) != RLK_OK) _exit(1);
    rlk_context_destroy(ctx);
    exit(0);
  }
  int status = 0;
  ck_assert_int_eq(waitpid(pid, &status, 0), pid);
  ck_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  size_t n;
  char *text = read_all(path, &n);
  ck_assert_msg(text && strstr(text, "logprob ") && strstr(text, "variant=bulk"), "%s", text ? text : "(no file)");
  free(text);
  rlk_test_rmtree(dir);
}
END_TEST

/* A link at the record path, or a link another user owns on its way, leads nowhere. */
START_TEST(record_follows_no_link) {
  if (!fork_ok()) return;
  char dir[1024], target[1100], link[1100], path[1300];
  rlk_test_mkdtemp(dir, sizeof dir, "rec-link");
  snprintf(target, sizeof target, "%s/target", dir);
  write_text(target, "precious\n", 0644);
  snprintf(link, sizeof link, "%s/record.conf", dir);
  ck_assert_int_eq(symlink(target, link), 0);
  child_run r = record_in_child(link, MODES("grpo"));
  expect_refused(&r, "a link at the path", "symbolic link");
  size_t n;
  char *text = read_all(target, &n);
  ck_assert_str_eq(text, "precious\n");
  free(text);
  /* A dangling link is not created through either. */
  char dangling[1100], absent[1100];
  snprintf(absent, sizeof absent, "%s/absent", dir);
  snprintf(dangling, sizeof dangling, "%s/dangling.conf", dir);
  ck_assert_int_eq(symlink(absent, dangling), 0);
  r = record_in_child(dangling, MODES("grpo"));
  expect_refused(&r, "a dangling link", "symbolic link");
  ck_assert_int_ne(access(absent, F_OK), 0);

  if (!skip_unless_root("a directory link of another user")) {
    /* /<dir>/theirs owned by another user holds a link 'd' to a directory of root's: a root
     * process that records to theirs/d/record.conf must not write into root's directory. */
    char theirs[1100], rootdir[1100], dlink[1200];
    snprintf(theirs, sizeof theirs, "%s/theirs", dir);
    snprintf(rootdir, sizeof rootdir, "%s/rootdir", dir);
    ck_assert_int_eq(mkdir(theirs, 0755), 0);
    ck_assert_int_eq(mkdir(rootdir, 0755), 0);
    snprintf(dlink, sizeof dlink, "%s/d", theirs);
    ck_assert_int_eq(symlink(rootdir, dlink), 0);
    ck_assert_int_eq(lchown(dlink, NOBODY_UID, NOBODY_UID), 0);
    ck_assert_int_eq(chown(theirs, NOBODY_UID, NOBODY_UID), 0);
    snprintf(path, sizeof path, "%s/record.conf", dlink);
    r = record_in_child(path, MODES("grpo"));
    expect_refused(&r, "a link of another user on the way", "owned by uid 65534");
    char inside[1200];
    snprintf(inside, sizeof inside, "%s/record.conf", rootdir);
    ck_assert_msg(access(inside, F_OK) != 0, "the record was written through another user's link");
    /* The same link owned by root is the root's own choice: followed. */
    ck_assert_int_eq(lchown(dlink, 0, 0), 0);
    r = record_in_child(path, MODES("grpo"));
    ck_assert_msg(r.status == 0 && r.err[0] == '\0', "%d:\n%s", r.status, r.err);
    ck_assert_msg(access(inside, F_OK) == 0, "a link of root's own was not followed");
  }
  rlk_test_rmtree(dir);
}
END_TEST

/* A file another user owns, one others may write, or one with a second name is not written. */
START_TEST(record_refuses_files_others_control) {
  char dir[1024], path[1100], other[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-owner")) return;

  write_text(path, "", 0666);
  child_run r = record_in_child(path, MODES("grpo"));
  expect_refused(&r, "a world-writable file", "world-writable");
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_size, 0);
  unlink(path);

  snprintf(other, sizeof other, "%s/other", dir);
  write_text(other, "", 0600);
  ck_assert_int_eq(link(other, path), 0);
  r = record_in_child(path, MODES("grpo"));
  expect_refused(&r, "a hard link", "names");
  ck_assert_int_eq(stat(other, &st), 0);
  ck_assert_int_eq(st.st_size, 0);
  unlink(path);

  if (!skip_unless_root("another user's file")) {
    write_text(path, "", 0644);
    ck_assert_int_eq(chown(path, NOBODY_UID, NOBODY_UID), 0);
    r = record_in_child(path, MODES("grpo"));
    expect_refused(&r, "another user's file", "owned by uid 65534");
    ck_assert_int_eq(stat(path, &st), 0);
    ck_assert_int_eq(st.st_size, 0);
  }
  rlk_test_rmtree(dir);
}
END_TEST

/* A FIFO at the record path is refused at once: the run neither blocks nor writes into it. */
START_TEST(record_refuses_a_fifo) {
  char dir[1024], path[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-fifo")) return;
  ck_assert_int_eq(mkfifo(path, 0600), 0);
  /* A reader that never reads keeps the FIFO open, as a hostile process would. */
  int reader = open(path, O_RDONLY | O_NONBLOCK);
  ck_assert_int_ge(reader, 0);
  child_run r = record_in_child(path, MODES("grpo", "rloo"));
  expect_refused(&r, "a FIFO", "not a regular file");
  char c;
  ck_assert_int_eq(read(reader, &c, 1), 0); /* nothing written (no writer left: end of file) */
  close(reader);
  rlk_test_rmtree(dir);
}
END_TEST

/* A reader's lock (flock or an OFD lock, any user who can open the file can take one) never
 * holds a call up: the lines wait and are written once the lock is free. */
START_TEST(record_never_waits_for_a_lock) {
  char dir[1024], path[1100];
  if (!record_dir(dir, sizeof dir, path, sizeof path, "rec-lock")) return;
  write_text(path, "", 0600);
  int holder = open(path, O_RDONLY);
  ck_assert_int_ge(holder, 0);
  ck_assert_int_eq(flock(holder, LOCK_SH), 0);
  int holder2 = open(path, O_RDONLY);
  struct flock fl = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
  ck_assert_int_eq(fcntl(holder2, F_OFD_SETLK, &fl), 0);

  /* While the lock is held the child's calls return; at its exit it waits a bounded time. */
  child_run r = record_in_child(path, MODES("grpo", "rloo"));
  ck_assert_msg(r.status == 0, "%d:\n%s", r.status, r.err);
  ck_assert_msg(r.seconds < 30, "the run took %.1f s", r.seconds);
  ck_assert_msg(strstr(r.err, "held the file's lock") != NULL, "no warning at exit:\n%s", r.err);
  struct stat st;
  ck_assert_int_eq(stat(path, &st), 0);
  ck_assert_int_eq(st.st_size, 0);

  /* Lines queued while the lock is held are written by a later call once it is free. */
  int called[2], freed[2];
  ck_assert_int_eq(pipe(called), 0);
  ck_assert_int_eq(pipe(freed), 0);
  pid_t pid = fork();
  ck_assert_int_ge(pid, 0);
  if (pid == 0) {
    setenv("RLK_JIT_RECORD", path, 1);
    call_modes(MODES("mean-only"));
    char x;
    if (write(called[1], "x", 1) != 1 || read(freed[0], &x, 1) != 1) _exit(2);
    struct stat now;
    if (stat(path, &now) != 0 || now.st_size != 0) _exit(3); /* queued, not written */
    usleep(600 * 1000); /* past the retry interval */
    call_modes(MODES("mean-only"));
    if (stat(path, &now) != 0 || now.st_size == 0) _exit(4); /* written by that call */
    _exit(0); /* no exit handlers: the call did it */
  }
  char x;
  ck_assert_int_eq(read(called[0], &x, 1), 1);
  fl.l_type = F_UNLCK;
  ck_assert_int_eq(fcntl(holder2, F_OFD_SETLK, &fl), 0);
  ck_assert_int_eq(flock(holder, LOCK_UN), 0);
  ck_assert_int_eq(write(freed[1], "x", 1), 1);
  int status = 0;
  waitpid(pid, &status, 0);
  ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child's check %d failed", WEXITSTATUS(status));
  size_t n;
  char *text = read_all(path, &n);
  ck_assert_int_eq(rlk_test_count_lines(text, "group_advantage"), 1);
  ck_assert_int_eq(rlk_test_count_lines(text, "mode=mean-only"), 1);
  free(text);
  close(holder);
  close(holder2);
  rlk_test_rmtree(dir);
}
END_TEST

/* De-duplication reads a file of any size: a 72 MiB record that holds a line gets it no more. */
START_TEST(record_reads_large_files) {
  if (!fork_ok()) return;
  char dir[1024], small[1100], big[1100];
  rlk_test_mkdtemp(dir, sizeof dir, "rec-big");
  snprintf(small, sizeof small, "%s/small.conf", dir);
  snprintf(big, sizeof big, "%s/big.conf", dir);
  child_run r = record_in_child(small, MODES("rloo"));
  ck_assert_msg(r.status == 0, "%d:\n%s", r.status, r.err);
  size_t n;
  char *line = read_all(small, &n);
  ck_assert_int_gt(n, 10);

  /* 72 MiB of comment lines, the line, and a partial last line a dead writer left. */
  FILE *f = fopen(big, "w");
  ck_assert_ptr_nonnull(f);
  static char filler[1 << 16];
  for (size_t i = 0; i < sizeof filler; i += 64) {
    memset(filler + i, 'x', 63);
    filler[i] = '#';
    filler[i + 63] = '\n';
  }
  for (int i = 0; i < 72 * 16; i++) ck_assert_int_eq(fwrite(filler, 1, sizeof filler, f), sizeof filler);
  ck_assert_int_eq(fwrite(line, 1, n, f), n);
  fputs("group_advantage mode=gr", f);
  fclose(f);
  chmod(big, 0600);
  struct stat before, after;
  ck_assert_int_eq(stat(big, &before), 0);
  r = record_in_child(big, MODES("rloo"));
  ck_assert_msg(r.status == 0 && r.err[0] == '\0', "%d:\n%s", r.status, r.err);
  ck_assert_int_eq(stat(big, &after), 0);
  ck_assert_int_eq(after.st_size, before.st_size);

  /* A new line goes after a newline that ends the partial one. */
  r = record_in_child(big, MODES("mean-only", "rloo"));
  ck_assert_msg(r.status == 0 && r.err[0] == '\0', "%d:\n%s", r.status, r.err);
  int fd = open(big, O_RDONLY);
  char tail[512];
  ssize_t got = pread(fd, tail, sizeof tail - 1, before.st_size - 23);
  close(fd);
  ck_assert_int_gt(got, 0);
  tail[got] = '\0';
  ck_assert_msg(!strncmp(tail, "group_advantage mode=gr\ngroup_advantage ", 40), "tail: %s", tail);
  ck_assert_int_eq(rlk_test_count_lines(tail, "mode=mean-only"), 1);
  ck_assert_int_eq(rlk_test_count_lines(tail, "mode=rloo"), 0);
  free(line);
  rlk_test_rmtree(dir);
}
END_TEST

Suite *record_suite(void) {
  Suite *s = suite_create("record");
  TCase *tc = rlk_test_add_case(s, "host", 120, TESTS(record_appends_each_configuration_once,
                                                      record_writes_hints_as_their_buckets, record_names_the_variant_the_environment_forced,
      record_follows_no_link, record_refuses_files_others_control, record_refuses_a_fifo,
      record_never_waits_for_a_lock, record_reads_large_files));
  tcase_add_checked_fixture(tc, (void (*)(void))rlk_test_setup_env, rlk_test_teardown_env);
  return s;
}
