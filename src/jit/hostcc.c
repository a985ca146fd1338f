/* hostcc.c - the host compiler: an installed clang (or the clang named by RLK_HOST_CC) run
 * as a child process to build a template's C source into a shared object for this CPU.
 *
 * Each compile works in a private temporary directory (mode 0700) holding the source and
 * the in-memory headers; the compiler runs without a shell, with a timeout, its output
 * captured as the log; the shared object is read back into memory and the directory
 * removed. The flags are fixed and generic (no -march=native): the binary depends only on
 * the key's inputs, so a cache entry stays valid on any machine of the same architecture. */
#include <dirent.h>
#include <elf.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/prctl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/core.h"
#include "core/target.h"
#include "jit/compiler.h"
#include "jit/compiler_impl.h"
#include "jit/sha256.h"

/* Seconds a compile may take before the compiler is killed, and for `--version`. */
#ifndef HOSTCC_COMPILE_TIMEOUT_S
#define HOSTCC_COMPILE_TIMEOUT_S 300.0
#endif
#define HOSTCC_VERSION_TIMEOUT_S 30.0
/* The most compiler output kept as the log. */
#define HOSTCC_LOG_MAX (1u << 20)
/* The largest shared object read back. */
#define HOSTCC_BINARY_MAX ((size_t)1 << 30)
#define HOSTCC_INSTALL_HINT "install clang (apt-get install clang) or set RLK_HOST_CC"

typedef struct hostcc_impl {
  char path[4096]; /* the compiler executable */
} hostcc_impl;

/* ---------------------------------------------------------------------------------- */
/* Finding and running the compiler                                                     */
/* ---------------------------------------------------------------------------------- */

static int is_executable_file(const char *path) {
  struct stat st;
  return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* Resolves `name` like execvp would: as given when it holds a '/', else through PATH. */
static int find_program(const char *name, char *out, size_t size) {
  if (!name || !*name) return 0;
  if (strchr(name, '/')) {
    if (!is_executable_file(name)) return 0;
    return rlk_format(out, size, "%s", name) >= 0;
  }
  const char *path = getenv("PATH");
  if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
  while (*path) {
    const char *end = strchr(path, ':');
    size_t len = end ? (size_t)(end - path) : strlen(path);
    if (len && rlk_format(out, size, "%.*s/%s", (int)len, path, name) >= 0 && is_executable_file(out))
      return 1;
    path += len;
    if (*path == ':') path++;
  }
  return 0;
}

/* Variables through which clang would take flags or header directories that no key holds
 * (CCC_OVERRIDE_OPTIONS edits its command line; CPATH and the *_INCLUDE_PATH lists add include
 * directories): the compiler runs without them, so that what it builds follows its key. */
static const char *const hostcc_unkeyed_env[] = {"CCC_OVERRIDE_OPTIONS", "CPATH", "C_INCLUDE_PATH",
                                                 "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH", NULL};

/* The compiler's environment: this process's without hostcc_unkeyed_env (the strings are
 * environ's; the array is the caller's to free). NULL when out of memory. Made before fork: the
 * child may not allocate. */
static char **compiler_env(void) {
  size_t n = 0;
  while (environ[n]) n++;
  char **e = malloc((n + 1) * sizeof *e);
  if (!e) return NULL;
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    int drop = 0;
    for (const char *const *v = hostcc_unkeyed_env; *v && !drop; v++) {
      const size_t l = strlen(*v);
      drop = !strncmp(environ[i], *v, l) && environ[i][l] == '=';
    }
    if (!drop) e[k++] = environ[i];
  }
  e[k] = NULL;
  return e;
}

/* The compiler's side of run_program, between fork and exec: only async-signal-safe calls. It
 * dies with the process that started it (PR_SET_PDEATHSIG: a parent killed with SIGKILL leaves
 * no compiler behind) and gets none of the caller's blocked or ignored signals. */
static void exec_program(char *const argv[], char *const envp[], int out_fd, pid_t parent) {
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != parent) _exit(127); /* the parent died before the line above */
  int in = open("/dev/null", O_RDONLY);
  if (in < 0 || dup2(in, 0) < 0 || dup2(out_fd, 1) < 0 || dup2(out_fd, 2) < 0) _exit(127);
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < NSIG; sig++)
    if (sig != SIGKILL && sig != SIGSTOP) sigaction(sig, &dfl, NULL);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, NULL);
  execve(argv[0], argv, envp);
  _exit(127);
}

/* Removes `name` under dirfd and everything below it with system calls alone (no allocation,
 * no stdio), as a forked child of a threaded process may. Entries removed while a directory is
 * read may shift the rest: it is read from its start until it is empty. */
struct raw_dirent64 {
  uint64_t ino;
  int64_t off;
  unsigned short reclen;
  unsigned char type;
  char name[];
};

static void raw_remove_tree(int dirfd, const char *name, int depth) {
  if (unlinkat(dirfd, name, 0) == 0 || errno == ENOENT || depth > 16) return;
  int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return;
  char buf[4096] __attribute__((aligned(8)));
  for (int pass = 0; pass < 64; pass++) {
    int removed = 0;
    lseek(fd, 0, SEEK_SET);
    for (;;) {
      long n = syscall(SYS_getdents64, fd, buf, sizeof buf);
      if (n <= 0) break;
      for (long off = 0; off < n;) {
        const struct raw_dirent64 *d = (const struct raw_dirent64 *)(buf + off);
        off += d->reclen;
        if (d->name[0] == '.' && (!d->name[1] || (d->name[1] == '.' && !d->name[2]))) continue;
        raw_remove_tree(fd, d->name, depth + 1);
        removed = 1;
      }
    }
    if (!removed) break;
  }
  close(fd);
  unlinkat(dirfd, name, AT_REMOVEDIR);
}

/* The child's side of run_program. With a work directory, the child stays between the caller
 * and the compiler as its guard: when the caller dies (even by SIGKILL) the guard gets SIGTERM
 * (PR_SET_PDEATHSIG), kills the compiler's process group and removes the directory; otherwise
 * it exits as the compiler did. A run_program timeout sends the guard SIGTERM too. */
static void run_child(char *const argv[], char *const envp[], int out_fd, pid_t parent, const char *work_dir) {
  setpgid(0, 0); /* a timeout kills what the compiler starts too */
  if (!work_dir) exec_program(argv, envp, out_fd, parent);
  sigset_t wait_for;
  sigemptyset(&wait_for);
  sigaddset(&wait_for, SIGTERM);
  sigaddset(&wait_for, SIGCHLD);
  sigprocmask(SIG_BLOCK, &wait_for, NULL);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  const pid_t guard = getpid();
  pid_t pid = getppid() == parent ? fork() : -1;
  if (pid == 0) {
    setpgid(0, 0);
    exec_program(argv, envp, out_fd, guard);
  }
  close(out_fd);
  for (;;) {
    siginfo_t si;
    int sig = pid > 0 ? sigwaitinfo(&wait_for, &si) : SIGTERM;
    if (sig == SIGCHLD) {
      int status = 0;
      if (waitpid(pid, &status, WNOHANG) != pid) continue;
      if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
      /* died from a signal: so does the guard, for the caller to see */
      const int with = WTERMSIG(status);
      signal(with, SIG_DFL);
      sigset_t one;
      sigemptyset(&one);
      sigaddset(&one, with);
      sigprocmask(SIG_UNBLOCK, &one, NULL);
      kill(guard, with);
      _exit(128 + with);
    }
    if (sig == SIGTERM) {
      if (pid > 0) {
        kill(-pid, SIGKILL);
        kill(pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
      }
      raw_remove_tree(AT_FDCWD, work_dir, 0);
      _exit(128 + SIGTERM);
    }
  }
}

/* Runs argv[0] (a path) with stdin from /dev/null and stdout + stderr captured into a
 * malloc'd *output (see run_child for how it is started). *exit_code is the exit status, or
 * -1 when the child died from a signal. */
static rlk_status run_program(char *const argv[], double timeout_s, const char *work_dir, char **output,
                              int *exit_code) {
  *output = NULL;
  *exit_code = -1;
  char **envp = compiler_env();
  if (!envp) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: out of memory", argv[0]);
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) {
    free(envp);
    return rlk_error(RLK_ERR_IO, "%s: cannot create a pipe: %s", argv[0], strerror(errno));
  }
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid == 0) run_child(argv, envp, fds[1], parent, work_dir);
  int fork_errno = errno;
  free(envp);
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return rlk_error(RLK_ERR_UNAVAILABLE, "%s: cannot run: %s", argv[0], strerror(fork_errno));
  }
  setpgid(pid, pid); /* also from this side, so kill(-pid) works whichever runs first */

  size_t cap = 4096, len = 0;
  char *buf = malloc(cap);
  double deadline = rlk_now() + timeout_s;
  int timed_out = 0, oom = 0;
  for (;;) {
    double left = deadline - rlk_now();
    if (left <= 0) {
      timed_out = 1;
      break;
    }
    struct pollfd p = {.fd = fds[0], .events = POLLIN};
    int ready = poll(&p, 1, left > 1.0 ? 1000 : (int)(left * 1000) + 1);
    if (ready < 0 && errno != EINTR) break;
    if (ready <= 0) continue;
    char chunk[4096];
    ssize_t got = read(fds[0], chunk, sizeof chunk);
    if (got < 0 && (errno == EINTR || errno == EAGAIN)) continue;
    if (got <= 0) break; /* EOF: the child (and anything it started) closed the pipe */
    if (!buf || len + (size_t)got + 1 > HOSTCC_LOG_MAX) continue; /* keep draining */
    if (len + (size_t)got + 1 > cap) {
      size_t ncap = cap * 2 >= len + (size_t)got + 1 ? cap * 2 : len + (size_t)got + 1;
      char *grown = realloc(buf, ncap);
      if (!grown) {
        oom = 1;
        continue;
      }
      buf = grown;
      cap = ncap;
    }
    memcpy(buf + len, chunk, (size_t)got);
    len += (size_t)got;
  }
  close(fds[0]);

  int status = 0;
  pid_t waited = 0;
  while (!timed_out) {
    waited = waitpid(pid, &status, WNOHANG);
    if (waited != 0 && !(waited < 0 && errno == EINTR)) break;
    if (rlk_now() >= deadline) {
      timed_out = 1;
      break;
    }
    usleep(2000);
  }
  if (timed_out) {
    if (work_dir) {
      kill(pid, SIGTERM); /* the guard kills the compiler and removes the work directory */
      for (int i = 0; i < 200 && waitpid(pid, &status, WNOHANG) == 0; i++) usleep(10000);
    }
    kill(-pid, SIGKILL);
    kill(pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    free(buf);
    return rlk_error(RLK_ERR_COMPILE, "%s: still running after %.0f s; killed", argv[0], timeout_s);
  }
  if (!buf || oom) {
    free(buf);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "%s: output", argv[0]);
  }
  buf[len] = '\0';
  *output = rlk_log_trim(buf);
  if (waited < 0) {
    /* SIGCHLD ignored by the application: the child was reaped for us and its status is
     * lost; the caller judges by the files it expects. */
    *exit_code = errno == ECHILD ? 0 : -1;
  } else if (WIFEXITED(status)) {
    *exit_code = WEXITSTATUS(status);
  }
  return RLK_OK;
}

/* The clang version from `--version` output ("Debian clang version 14.0.6" -> "14.0.6").
 * Only clang is accepted: the templates and flags are written for it, and the JIT picks the
 * host template set by the compiler kind "clang". */
static int parse_version(const char *text, char *version, size_t size) {
  const char *clang = strstr(text, "clang version ");
  const char *eol = strchr(text, '\n');
  if (!clang || (eol && clang > eol)) return 0;
  const char *start = clang + strlen("clang version ");
  size_t n = 0;
  while ((start[n] >= '0' && start[n] <= '9') || start[n] == '.') n++;
  while (n && start[n - 1] == '.') n--;
  if (n == 0 || n >= size) return 0;
  memcpy(version, start, n);
  version[n] = '\0';
  return 1;
}

/* The compiler's identity beyond its version number, 16 hex digits of a digest into id[17]: its
 * --version text but the InstalledDir line (the vendor, the version string and the target, not
 * where it is installed, so that a tree built with one clang serves the same clang elsewhere),
 * and, where the compiler is a script (RLK_HOST_CC naming a wrapper that may add flags), the
 * script itself. Two compilers that could build different code get different keys. */
static void compiler_identity(const char *version_text, const char *path, char id[17]) {
  rlk_sha256 h;
  rlk_sha256_init(&h);
  for (const char *line = version_text; *line;) {
    const size_t n = strcspn(line, "\n");
    if (strncmp(line, "InstalledDir:", 13) != 0) {
      rlk_sha256_update(&h, line, n);
      rlk_sha256_update(&h, "\n", 1);
    }
    line += n + (line[n] == '\n');
  }
  FILE *f = fopen(path, "rb");
  if (f) {
    char buf[4096];
    size_t got = fread(buf, 1, sizeof buf, f);
    if (got >= 2 && buf[0] == '#' && buf[1] == '!') { /* a script: its text is part of the compiler */
      size_t total = 0;
      rlk_sha256_update(&h, "script\n", 7);
      while (got > 0 && total < ((size_t)1 << 20)) {
        rlk_sha256_update(&h, buf, got);
        total += got;
        got = fread(buf, 1, sizeof buf, f);
      }
    }
    fclose(f);
  }
  uint8_t d[32];
  rlk_sha256_final(&h, d);
  char hex[65];
  rlk_sha256_hex(d, hex);
  memcpy(id, hex, 16);
  id[16] = '\0';
}

/* ---------------------------------------------------------------------------------- */
/* The private working directory                                                        */
/* ---------------------------------------------------------------------------------- */

/* A name the request gives a file: relative, no empty, "." or ".." components, printable. */
static int safe_relative_name(const char *name) {
  size_t len = strlen(name);
  if (len == 0 || len > 255 || name[0] == '/') return 0;
  for (size_t i = 0; i < len; i++)
    if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f || name[i] == '\\') return 0;
  const char *p = name;
  while (*p) {
    const char *end = strchr(p, '/');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.')) return 0;
    if (!end) break;
    p = end + 1;
    if (!*p) return 0; /* trailing slash */
  }
  return 1;
}

/* Writes `text` to dir/name, creating the directories of `name` (0700) on the way. */
static rlk_status write_file(const char *dir, const char *name, const char *text) {
  char path[4096];
  if (rlk_format(path, sizeof path, "%s/%s", dir, name) < 0)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "host compiler: file name too long: %s", name);
  for (char *slash = strchr(path + strlen(dir) + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
    *slash = '\0';
    int made = mkdir(path, 0700);
    int err = errno;
    *slash = '/';
    if (made != 0 && err != EEXIST)
      return rlk_error(RLK_ERR_IO, "host compiler: cannot create a directory for %s: %s", name, strerror(err));
  }
  int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0)
    return rlk_error(errno == EEXIST ? RLK_ERR_INVALID_ARGUMENT : RLK_ERR_IO,
                     "host compiler: cannot write %s: %s", name, strerror(errno));
  size_t len = strlen(text), done = 0;
  while (done < len) {
    ssize_t n = write(fd, text + done, len - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      close(fd);
      return rlk_error(RLK_ERR_IO, "host compiler: cannot write %s: %s", name, strerror(err));
    }
    done += (size_t)n;
  }
  if (close(fd) != 0)
    return rlk_error(RLK_ERR_IO, "host compiler: cannot write %s: %s", name, strerror(errno));
  return RLK_OK;
}

static rlk_status read_file(const char *path, void **data, size_t *size) {
  *data = NULL;
  *size = 0;
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd < 0) return rlk_error(RLK_ERR_IO, "host compiler: cannot open %s: %s", path, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
      (uint64_t)st.st_size > HOSTCC_BINARY_MAX) {
    close(fd);
    return rlk_error(RLK_ERR_IO, "host compiler: %s is empty, too large or not a file", path);
  }
  size_t want = (size_t)st.st_size, done = 0;
  char *buf = malloc(want);
  if (!buf) {
    close(fd);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host compiler: %zu-byte shared object", want);
  }
  while (done < want) {
    ssize_t n = read(fd, buf + done, want - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += (size_t)n;
  }
  close(fd);
  if (done != want) {
    free(buf);
    return rlk_error(RLK_ERR_IO, "host compiler: short read of %s", path);
  }
  *data = buf;
  *size = want;
  return RLK_OK;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
  (void)st;
  (void)type;
  (void)ftw;
  remove(path);
  return 0;
}

static void remove_tree(const char *dir) {
  if (nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0) rmdir(dir);
}

/* Compiles work in <TMPDIR>/rlk-cc-<pid>-XXXXXX. */
#define WORK_PREFIX "rlk-cc-"
#define WORK_MAX_AGE (24 * 3600) /* a directory this old is abandoned whatever its pid says */

static const char *work_root(void) {
  const char *tmp = getenv("TMPDIR");
  return tmp && *tmp == '/' ? tmp : "/tmp";
}

/* Removes this user's work directories left by processes that died mid-compile (killed
 * before they could clean up): those whose pid is gone, and any older than a day. Only
 * directories of the work name, owned by this user and not links, are touched. */
static void reap_abandoned_work(void) {
  const char *root = work_root();
  DIR *d = opendir(root);
  if (!d) return;
  const size_t np = strlen(WORK_PREFIX);
  const int64_t now = rlk_unix_time();
  struct dirent *de;
  while ((de = readdir(d)) != NULL) {
    const char *name = de->d_name;
    if (strncmp(name, WORK_PREFIX, np) != 0) continue;
    char *end = NULL;
    long pid = strtol(name + np, &end, 10);
    if (end == name + np || *end != '-' || strlen(end) != 7 || pid <= 0) continue;
    struct stat st;
    if (fstatat(dirfd(d), name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode) ||
        st.st_uid != geteuid())
      continue;
    int dead = pid != (long)getpid() && kill((pid_t)pid, 0) != 0 && errno == ESRCH;
    if (!dead && now - (int64_t)st.st_mtime < WORK_MAX_AGE) continue;
    char path[4096];
    if (rlk_format(path, sizeof path, "%s/%s", root, name) < 0) continue;
    rlk_debug("host compiler: removing abandoned %s", path);
    remove_tree(path);
  }
  closedir(d);
}

/* ---------------------------------------------------------------------------------- */
/* Checking the exports                                                                 */
/* ---------------------------------------------------------------------------------- */

/* The first of `names` that the shared object does not export as a defined symbol of
 * default (or protected) visibility, or NULL when all are there. Objects that are not
 * ELF64 in the host's byte order are not inspected (NULL). */
static const char *elf_missing_export(const unsigned char *data, size_t size,
                                      const char *const *names, size_t nnames) {
  Elf64_Ehdr eh;
  if (size < sizeof eh) return NULL;
  memcpy(&eh, data, sizeof eh);
  const uint16_t one = 1;
  const int little = *(const unsigned char *)&one == 1;
  if (memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
      eh.e_ident[EI_DATA] != (little ? ELFDATA2LSB : ELFDATA2MSB))
    return NULL;
  if (eh.e_shentsize != sizeof(Elf64_Shdr) || eh.e_shoff > size ||
      (size - eh.e_shoff) / sizeof(Elf64_Shdr) < eh.e_shnum)
    return nnames ? names[0] : NULL;
  const Elf64_Shdr *dynsym = NULL, *dynstr = NULL;
  Elf64_Shdr sh, link;
  for (size_t i = 0; i < eh.e_shnum; i++) {
    memcpy(&sh, data + eh.e_shoff + i * sizeof sh, sizeof sh);
    if (sh.sh_type != SHT_DYNSYM || sh.sh_link >= eh.e_shnum) continue;
    memcpy(&link, data + eh.e_shoff + sh.sh_link * sizeof link, sizeof link);
    dynsym = &sh;
    dynstr = &link;
    break;
  }
  if (!dynsym || dynsym->sh_entsize != sizeof(Elf64_Sym) || dynsym->sh_offset > size ||
      dynsym->sh_size > size - dynsym->sh_offset || dynstr->sh_offset > size ||
      dynstr->sh_size > size - dynstr->sh_offset)
    return nnames ? names[0] : NULL;
  const char *strtab = (const char *)data + dynstr->sh_offset;
  size_t nsyms = dynsym->sh_size / sizeof(Elf64_Sym);
  for (size_t k = 0; k < nnames; k++) {
    int found = 0;
    for (size_t i = 0; i < nsyms && !found; i++) {
      Elf64_Sym sym;
      memcpy(&sym, data + dynsym->sh_offset + i * sizeof sym, sizeof sym);
      if (sym.st_shndx == SHN_UNDEF || sym.st_name >= dynstr->sh_size) continue;
      int bind = ELF64_ST_BIND(sym.st_info), vis = ELF64_ST_VISIBILITY(sym.st_other);
      if ((bind != STB_GLOBAL && bind != STB_WEAK) || (vis != STV_DEFAULT && vis != STV_PROTECTED))
        continue;
      const char *name = strtab + sym.st_name;
      size_t room = dynstr->sh_size - sym.st_name;
      size_t want = strlen(names[k]);
      found = want < room && memcmp(name, names[k], want + 1) == 0;
    }
    if (!found) return names[k];
  }
  return NULL;
}

/* ---------------------------------------------------------------------------------- */
/* Compiling                                                                            */
/* ---------------------------------------------------------------------------------- */

static int hostcc_supports_target(const rlk_compiler *self, const rlk_target *target) {
  (void)self;
  return target && target->kind == RLK_BACKEND_HOST && strcmp(target->name, rlk_host_target()) == 0;
}

static int is_identifier(const char *s) {
  if (!s || !*s || (*s >= '0' && *s <= '9')) return 0;
  for (; *s; s++)
    if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
      return 0;
  return 1;
}

/* Request options are defines only: they come from typed parameter schemas, and anything
 * else (an output path, a plugin) has no business on this command line. */
static int allowed_option(const char *opt) {
  return (strncmp(opt, "-D", 2) == 0 || strncmp(opt, "-U", 2) == 0) && opt[2] != '\0';
}

static rlk_status hostcc_check(rlk_compiler *self, const rlk_compile_request *req) {
  for (size_t i = 0; i < req->noptions; i++)
    if (!allowed_option(req->options[i]))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: option '%s' is not allowed (only -D and -U)",
                       self->id, req->options[i]);
  for (size_t i = 0; i < req->nnames; i++)
    if (!is_identifier(req->names[i]))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: '%s' is not a C symbol name", self->id,
                       req->names[i]);
  for (size_t i = 0; i < req->nheaders; i++)
    if (!safe_relative_name(req->header_names[i]))
      return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: header name '%s' is not a plain relative path",
                       self->id, req->header_names[i]);
  if (req->noptions > 4096 || req->nheaders > 4096 || req->nnames > 4096)
    return rlk_error(RLK_ERR_INVALID_ARGUMENT, "%s: request too large", self->id);
  return RLK_OK;
}

/* Removes every "<dir>/" from the log in place, so messages name files as the request
 * did rather than by the private directory's random name. */
static void strip_prefix(char *log, const char *dir) {
  size_t n = strlen(dir);
  char *out = log;
  for (const char *in = log; *in;) {
    if (strncmp(in, dir, n) == 0 && in[n] == '/') {
      in += n + 1;
      continue;
    }
    *out++ = *in++;
  }
  *out = '\0';
}

/* Runs the compiler in `dir` and fills `out` (binary, names, log). */
static rlk_status hostcc_build(rlk_compiler *self, const rlk_compile_request *req, const char *dir,
                               const char *source, rlk_compile_result *out) {
  hostcc_impl *impl = self->impl;
  char include[4200], prefix_map[8300], output[4200], input[4400];
  rlk_format(include, sizeof include, "-I%s", dir);
  /* Paths of the temporary directory must not reach the binary (__FILE__, messages in
   * assertions): map it to ".". */
  rlk_format(prefix_map, sizeof prefix_map, "-ffile-prefix-map=%s=.", dir);
  rlk_format(output, sizeof output, "%s/kernel.so", dir);
  rlk_format(input, sizeof input, "%s/%s", dir, source);

  size_t max = 1 + self->nbase_options + req->noptions + 10;
  char **argv = calloc(max, sizeof *argv);
  if (!argv) return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host compiler: arguments");
  size_t k = 0;
  argv[k++] = impl->path;
  for (size_t i = 0; i < self->nbase_options; i++)
    if (strncmp(self->base_options[i], "-l", 2) != 0) argv[k++] = (char *)self->base_options[i];
  for (size_t i = 0; i < req->noptions; i++) argv[k++] = (char *)req->options[i];
  argv[k++] = include;
  argv[k++] = prefix_map;
  argv[k++] = "-o";
  argv[k++] = output;
  argv[k++] = "-x";
  argv[k++] = "c";
  argv[k++] = input;
  argv[k++] = "-x";
  argv[k++] = "none";
  /* Libraries go after the input so the linker uses them. */
  for (size_t i = 0; i < self->nbase_options; i++)
    if (strncmp(self->base_options[i], "-l", 2) == 0) argv[k++] = (char *)self->base_options[i];
  argv[k] = NULL;

  char *log = NULL;
  int code = -1;
  rlk_status st = run_program(argv, HOSTCC_COMPILE_TIMEOUT_S, dir, &log, &code);
  free(argv);
  if (log) strip_prefix(log, dir);
  char why[512];
  if (st != RLK_OK) {
    rlk_format(why, sizeof why, "%s", rlk_last_error());
    return rlk_compile_error(self, req, why, NULL);
  }
  if (code != 0) {
    char detail[64] = "";
    if (!*log) rlk_format(detail, sizeof detail, "the compiler failed (status %d)", code);
    st = rlk_compile_error(self, req, detail, log);
    free(log);
    return st;
  }
  if ((st = read_file(output, &out->binary, &out->size)) != RLK_OK) {
    rlk_format(why, sizeof why, "%s", rlk_last_error());
    st = rlk_compile_error(self, req, why, log);
    free(log);
    return st;
  }
  out->binary_name = "kernel.so";
  const char *missing = elf_missing_export(out->binary, out->size, req->names, req->nnames);
  if (missing) {
    char detail[400];
    rlk_format(detail, sizeof detail,
               "symbol '%s' is not exported by the shared object (define it with default visibility)",
               missing);
    st = rlk_compile_error(self, req, detail, log);
    free(log);
    return st;
  }
  out->lowered_names = rlk_string_list_copy(req->names, req->nnames);
  if (!out->lowered_names) {
    free(log);
    return rlk_error(RLK_ERR_OUT_OF_MEMORY, "host compiler: names");
  }
  out->nnames = req->nnames;
  out->log = log;
  return RLK_OK;
}

static rlk_status hostcc_compile(rlk_compiler *self, const rlk_compile_request *req,
                                 rlk_compile_result *out) {
  rlk_status st = rlk_compile_begin(self, "host compiler", req, out);
  if (st == RLK_OK) st = hostcc_check(self, req);
  if (st != RLK_OK) return st;
  const char *source = req->source_name && safe_relative_name(req->source_name) ? req->source_name
                                                                                 : "kernel.c";
  double start = rlk_now();
  const char *tmp = work_root();
  char dir[4096];
  if (rlk_format(dir, sizeof dir, "%s/" WORK_PREFIX "%ld-XXXXXX", tmp, (long)getpid()) < 0)
    return rlk_error(RLK_ERR_IO, "host compiler: TMPDIR path too long");
  if (!mkdtemp(dir))
    return rlk_error(RLK_ERR_IO, "host compiler: cannot create a directory under %s: %s", tmp,
                     strerror(errno));
  for (size_t i = 0; i < req->nheaders && st == RLK_OK; i++)
    st = write_file(dir, req->header_names[i], req->header_sources[i]);
  if (st == RLK_OK) st = write_file(dir, source, req->source);
  if (st == RLK_OK) st = hostcc_build(self, req, dir, source, out);
  remove_tree(dir);
  if (st != RLK_OK) {
    rlk_compile_result_free(out);
    return st;
  }
  out->seconds = rlk_now() - start;
  rlk_debug("%s: %s: %zu-byte shared object in %.3f s", self->id, source, out->size, out->seconds);
  return RLK_OK;
}

static void hostcc_destroy(rlk_compiler *self) {
  if (!self) return;
  free(self->impl);
  free(self);
}

rlk_status rlk_hostcc_open(rlk_compiler **out) {
  rlk_compiler *c = NULL;
  rlk_status st = rlk_compiler_new("host compiler", "host compiler", sizeof(hostcc_impl), out, &c);
  if (st != RLK_OK) return st;
  hostcc_impl *impl = c->impl;
  c->destroy = hostcc_destroy;

  const char *wanted = rlk_env("RLK_HOST_CC");
  if (wanted) {
    if (!find_program(wanted, impl->path, sizeof impl->path)) {
      hostcc_destroy(c);
      return rlk_error(RLK_ERR_UNAVAILABLE, "host compiler: RLK_HOST_CC=%s is not an executable on PATH",
                       wanted);
    }
  } else if (!find_program("clang-14", impl->path, sizeof impl->path) &&
             !find_program("clang", impl->path, sizeof impl->path)) {
    hostcc_destroy(c);
    return rlk_error(RLK_ERR_UNAVAILABLE, "host compiler: no clang-14 or clang on PATH; " HOSTCC_INSTALL_HINT);
  }

  reap_abandoned_work();
  char *argv[] = {impl->path, "--version", NULL};
  char *text = NULL;
  int code = -1;
  st = run_program(argv, HOSTCC_VERSION_TIMEOUT_S, NULL, &text, &code);
  if (st != RLK_OK) {
    hostcc_destroy(c);
    return rlk_error_wrap(RLK_ERR_UNAVAILABLE, "host compiler");
  }
  char version[32];
  int ok = code == 0 && parse_version(text, version, sizeof version);
  if (!ok) {
    int first_line = (int)strcspn(text, "\n");
    st = rlk_error(RLK_ERR_UNAVAILABLE, "host compiler: %s is not clang (--version: '%.*s'); "
                   HOSTCC_INSTALL_HINT, impl->path, first_line < 200 ? first_line : 200, text);
    free(text);
    hostcc_destroy(c);
    return st;
  }
  char identity[17];
  compiler_identity(text, impl->path, identity);
  free(text);

  c->kind = "clang";
  rlk_format(c->version, sizeof c->version, "%s", version);
  rlk_format(c->id, sizeof c->id, "clang-%s-%s", version, identity);
  rlk_format(c->targets, sizeof c->targets, "%s", rlk_host_target());
  c->compile = hostcc_compile;
  c->supports_target = hostcc_supports_target;
  /* Base options, part of every key:
   *   -std=c11 -O2                 the dialect and a fixed optimization level
   *   -fPIC -shared                a loadable shared object
   *   -fvisibility=hidden          only the entry points the template marks are exported
   *   -ffp-contract=off            no fused multiply-add: results match the fp64-checked
   *                                references and do not change with the CPU's features
   *   -fno-math-errno              math functions may be inlined (no errno side effect);
   *                                results are unchanged
   *   -lm                          the object names libm itself rather than relying on
   *                                the process having loaded it
   * No -march=native and no -ffast-math: the code must not depend on the build machine. */
  static const char *const base[] = {"-std=c11",          "-O2",           "-fPIC",
                                     "-shared",           "-fvisibility=hidden",
                                     "-ffp-contract=off", "-fno-math-errno", "-lm"};
  for (size_t i = 0; i < sizeof base / sizeof base[0]; i++) c->base_options[i] = base[i];
  c->nbase_options = sizeof base / sizeof base[0];
  impl->path[sizeof impl->path - 1] = '\0';
  rlk_info("host compiler: %s (%s) for %s", c->id, impl->path, c->targets);
  *out = c;
  return RLK_OK;
}
