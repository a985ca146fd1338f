/* tool_pool.h - runs a list of items in forked worker processes: item i on worker i % jobs, each
 * worker with state of its own (its contexts), each item's report sent back through the worker's
 * pipe. One compiler runs at a time inside a process (NVRTC serializes), so processes are what
 * scale a precompile or a sweep's compile phase. Include after tool_util.h. */
#ifndef RLK_TOOL_POOL_H
#define RLK_TOOL_POOL_H

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "rlk.h"

#define POOL_MAX_MSG 16384

/* What a worker says about one item; msglen bytes of message follow it through the pipe. */
typedef struct pool_report {
  uint32_t item;    /* the item's index */
  int32_t status;   /* an rlk_status */
  int32_t count[2]; /* the item's own numbers (rlk-precompile: kernels, and how many it compiled) */
  double seconds;
  uint32_t msglen;
} pool_report;

typedef struct pool_ops {
  void *user;
  /* In each worker: its state (NULL allowed), the run of item i (fill r->status, counts and
   * seconds, and msg, NUL-terminated within POOL_MAX_MSG bytes), and the state's end. */
  void *(*open)(void *user);
  void (*run)(void *user, void *state, size_t i, pool_report *r, char *msg);
  void (*close)(void *user, void *state);
  /* In the parent: one item's result, exactly once per item, in completion order. */
  void (*done)(void *user, const pool_report *r, const char *msg);
} pool_ops;

typedef struct pool_child {
  pid_t pid;
  int fd;
  char *buf;
  size_t len, cap;
} pool_child;

/* Forks a child that runs child(write end of a pipe, arg), which must end with _exit; the parent
 * gets the read end in *fd. Returns the child's pid, or -1 with the reason printed. */
TOOL_UNUSED static pid_t pool_spawn(int *fd, void (*child)(int fd, void *arg), void *arg) {
  int p[2];
  if (pipe(p) != 0) {
    fprintf(stderr, "%s: pipe: %s\n", prog, strerror(errno));
    return -1;
  }
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) {
    fprintf(stderr, "%s: fork: %s\n", prog, strerror(errno));
    close(p[0]);
    close(p[1]);
    return -1;
  }
  if (pid == 0) {
    close(p[0]);
    signal(SIGPIPE, SIG_DFL);
    child(p[1], arg);
    _exit(127); /* not reached: the child exits itself */
  }
  close(p[1]);
  *fd = p[0];
  return pid;
}

/* Reports an item once: later reports of the same item are dropped. */
TOOL_UNUSED static void pool_done(const pool_ops *ops, char *reported, size_t n, const pool_report *r,
                                  const char *msg) {
  if (r->item >= n || reported[r->item]) return;
  reported[r->item] = 1;
  ops->done(ops->user, r, msg);
}

TOOL_UNUSED static void pool_fail(const pool_ops *ops, char *reported, size_t n, size_t i, const char *why) {
  pool_report r;
  memset(&r, 0, sizeof r);
  r.item = (uint32_t)i;
  r.status = RLK_ERR_INTERNAL;
  pool_done(ops, reported, n, &r, why);
}

TOOL_UNUSED static void pool_run_one(const pool_ops *ops, void *state, size_t i, pool_report *r, char *msg) {
  memset(r, 0, sizeof *r);
  msg[0] = '\0';
  ops->run(ops->user, state, i, r, msg);
  r->item = (uint32_t)i;
  msg[POOL_MAX_MSG - 1] = '\0';
  r->msglen = (uint32_t)strlen(msg);
}

/* Parses the complete reports in a child's buffer. */
TOOL_UNUSED static void pool_drain(const pool_ops *ops, char *reported, size_t n, pool_child *c) {
  size_t off = 0;
  for (;;) {
    pool_report r;
    if (c->len - off < sizeof r) break;
    memcpy(&r, c->buf + off, sizeof r);
    if (r.msglen >= POOL_MAX_MSG) r.msglen = POOL_MAX_MSG - 1;
    if (c->len - off < sizeof r + r.msglen) break;
    char msg[POOL_MAX_MSG];
    memcpy(msg, c->buf + off + sizeof r, r.msglen);
    msg[r.msglen] = '\0';
    pool_done(ops, reported, n, &r, msg);
    off += sizeof r + r.msglen;
  }
  memmove(c->buf, c->buf + off, c->len - off);
  c->len -= off;
}

typedef struct pool_worker_arg {
  const pool_ops *ops;
  size_t n;
  int jobs, worker;
  const pool_child *kids; /* the workers started before this one */
} pool_worker_arg;

/* A worker: its own state; items w, w + jobs, ...; reports through the pipe. */
TOOL_UNUSED static void pool_worker(int fd, void *arg) {
  static char msg[POOL_MAX_MSG];
  const pool_worker_arg *a = arg;
  for (int k = 0; k < a->worker; k++) close(a->kids[k].fd);
  void *state = a->ops->open ? a->ops->open(a->ops->user) : NULL;
  int rc = 0;
  for (size_t i = (size_t)a->worker; i < a->n; i += (size_t)a->jobs) {
    pool_report r;
    pool_run_one(a->ops, state, i, &r, msg);
    if (write_all(fd, &r, sizeof r) || write_all(fd, msg, r.msglen)) {
      rc = 1;
      break;
    }
  }
  if (a->ops->close) a->ops->close(a->ops->user, state);
  close(fd);
  _exit(rc);
}

/* Runs items [0, n) on `jobs` workers (1: in this process). Every item is reported once; the
 * items of a worker that could not start, or that died, fail with RLK_ERR_INTERNAL and why. */
TOOL_UNUSED static void pool_run(size_t n, int jobs, const pool_ops *ops) {
  static char msg[POOL_MAX_MSG];
  char *reported = calloc(n ? n : 1, 1);
  if (!reported) {
    fprintf(stderr, "%s: out of memory\n", prog);
    exit(1);
  }
  if (jobs <= 1) {
    void *state = ops->open ? ops->open(ops->user) : NULL;
    for (size_t i = 0; i < n; i++) {
      pool_report r;
      pool_run_one(ops, state, i, &r, msg);
      pool_done(ops, reported, n, &r, msg);
    }
    if (ops->close) ops->close(ops->user, state);
    free(reported);
    return;
  }
  pool_child *kids = xrealloc(NULL, (size_t)jobs * sizeof *kids);
  memset(kids, 0, (size_t)jobs * sizeof *kids);
  pool_worker_arg wa = {ops, n, jobs, 0, kids};
  int started = 0;
  for (int w = 0; w < jobs; w++) {
    wa.worker = w;
    pid_t pid = pool_spawn(&kids[w].fd, pool_worker, &wa);
    if (pid < 0) break;
    kids[w].pid = pid;
    started++;
  }
  for (size_t i = 0; i < n; i++) /* the items of workers that could not start */
    if ((int)(i % (size_t)jobs) >= started) pool_fail(ops, reported, n, i, "its worker could not start");

  int open_fds = started;
  struct pollfd *pfd = xrealloc(NULL, (size_t)jobs * sizeof *pfd);
  int *map = xrealloc(NULL, (size_t)jobs * sizeof *map);
  while (open_fds > 0) {
    int m = 0;
    for (int w = 0; w < started; w++) {
      if (kids[w].fd < 0) continue;
      pfd[m].fd = kids[w].fd;
      pfd[m].events = POLLIN;
      pfd[m].revents = 0;
      map[m++] = w;
    }
    int k = poll(pfd, (nfds_t)m, -1);
    if (k < 0) {
      if (errno == EINTR) continue;
      fprintf(stderr, "%s: poll: %s\n", prog, strerror(errno));
      break;
    }
    for (int i = 0; i < m; i++) {
      if (!pfd[i].revents) continue;
      pool_child *c = &kids[map[i]];
      if (c->cap - c->len < 65536) {
        c->cap = c->cap ? c->cap * 2 : 131072;
        c->buf = xrealloc(c->buf, c->cap);
      }
      ssize_t got = read(c->fd, c->buf + c->len, c->cap - c->len);
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) {
        close(c->fd);
        c->fd = -1;
        open_fds--;
        continue;
      }
      c->len += (size_t)got;
      pool_drain(ops, reported, n, c);
    }
  }
  for (int w = 0; w < started; w++) {
    if (kids[w].fd >= 0) close(kids[w].fd);
    int status = 0;
    while (waitpid(kids[w].pid, &status, 0) < 0 && errno == EINTR) {
    }
    char why[160];
    if (WIFSIGNALED(status))
      snprintf(why, sizeof why, "worker %d was killed by signal %d before finishing it", w, WTERMSIG(status));
    else
      snprintf(why, sizeof why, "worker %d exited with status %d before finishing it", w,
               WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    for (size_t i = (size_t)w; i < n; i += (size_t)jobs) pool_fail(ops, reported, n, i, why);
    free(kids[w].buf);
  }
  free(pfd);
  free(map);
  free(kids);
  free(reported);
}

#endif
