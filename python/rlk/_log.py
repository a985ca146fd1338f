"""librlk's log messages through Python's logging (the "rlk" logger), not C's stderr.

The library calls back with each message (rlk_set_log_callback): errors, warnings and debug lines
go to the logger at their level; a kernel compile ("compiling <kernel> <settings> for <target>")
is held until the call that compiled it returns and is then logged at INFO with the time it
took (until the next compile of that call, or the call's end: compiling and loading); each
thread's compiles are its own calls' (the library logs a compile on the thread that runs it), so
calls on several threads at once each log their own compiles with their own times. Without
logging configured, Python shows warnings and errors on stderr as before; logging.basicConfig(
level=logging.INFO) shows every first compile. summary() is the one-line account on demand.
"""
import atexit
import ctypes
import logging
import threading
import time

from . import _types as T
from .errors import CompileError

logger = logging.getLogger("rlk")

_LEVELS = {T.LogLevel.ERROR: logging.ERROR, T.LogLevel.WARN: logging.WARNING,
           T.LogLevel.INFO: logging.INFO, T.LogLevel.DEBUG: logging.DEBUG}
_COMPILING = "compiling "

CALLBACK = ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)

pending = []      # (thread, description, start) of compiles whose call has not returned yet
_lock = threading.Lock()
compiled = {"kernels": 0, "seconds": 0.0}  # what this process compiled, as logged


def _on_message(level, message, user):
    text = message.decode("utf-8", "replace")
    if text.startswith(_COMPILING):
        with _lock:
            pending.append((threading.get_ident(), text[len(_COMPILING):], time.perf_counter()))
        return
    logger.log(_LEVELS.get(level, logging.DEBUG), "%s", text)


_callback = CALLBACK(_on_message)  # kept alive as long as the library may call it


def install(lib):
    """Routes the library's messages here (asked once, when the library is loaded). The library
    then produces info messages too, whatever RLK_LOG says; debug ones when RLK_LOG=debug or the
    rlk logger is at DEBUG when the library is loaded."""
    lib.rlk_set_log_callback.restype = None
    lib.rlk_set_log_callback.argtypes = [CALLBACK, ctypes.c_int, ctypes.c_void_p]
    level = T.LogLevel.DEBUG if logger.isEnabledFor(logging.DEBUG) else T.LogLevel.INFO
    lib.rlk_set_log_callback(_callback, int(level), None)
    # messages logged while the interpreter shuts down go to stderr, not into Python
    atexit.register(lib.rlk_set_log_callback, CALLBACK(), 0, None)  # a NULL callback


def flush(status=0):
    """Logs the compiles of the call that just returned on this thread, each with its time (those
    of calls still running on other threads stay pending until those calls return). status: the
    call's rlk_status; a compile error is its last compile's (a failed compile ends the call),
    logged as failed, not as compiled (the exception says why)."""
    now = time.perf_counter()
    failed = int(status or 0) == CompileError.status
    me = threading.get_ident()
    with _lock:
        done = [(what, start) for who, what, start in pending if who == me]
        pending[:] = [p for p in pending if p[0] != me]
    for i, (what, start) in enumerate(done):
        end = done[i + 1][1] if i + 1 < len(done) else now
        if failed and i == len(done) - 1:
            logger.info("compiling %s failed after %.2f s", what, end - start)
            break
        compiled["kernels"] += 1
        compiled["seconds"] += end - start
        logger.info("compiled %s in %.2f s", what, end - start)


def summary(contexts):
    """The one-line account of the kernels of `contexts` (dict of Context): compiled, loaded
    from the cache, looked up in memory; returned and logged at INFO."""
    total = {"calls": 0, "memory_hits": 0, "disk_hits": 0, "compiles": 0,
             "compile_seconds": 0.0, "load_seconds": 0.0}
    for ctx in list(contexts.values()):
        c = ctx.counters()
        for k in total:
            total[k] += c[k]
    line = ("rlk: %d kernel%s compiled in %.2f s, %d loaded from the kernel cache in %.2f s; "
            "%d lookups, %d in memory" % (
                total["compiles"], "" if total["compiles"] == 1 else "s", total["compile_seconds"],
                total["disk_hits"], total["load_seconds"], total["calls"], total["memory_hits"]))
    logger.info("%s", line)
    return line
