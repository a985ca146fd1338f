"""Exceptions: one class per rlk_status, each carrying the library's rlk_last_error() text.

Where a status has a natural Python meaning the class also derives from the builtin
(InvalidArgument is a ValueError, OutOfMemory a MemoryError, ...), so callers can catch either.
"""

__all__ = [
    "RlkError", "InvalidArgument", "Unsupported", "Unavailable", "CompileError", "JitDisabled",
    "CacheError", "BackendError", "OutOfMemory", "RlkIOError", "Timeout", "InternalError",
    "LibraryNotFound", "AbiMismatch", "error_for_status",
]


class RlkError(Exception):
    """A failed rlk call. `status` is the rlk_status code, `message` the library's detail."""

    status = None

    def __init__(self, message, status=None):
        super().__init__(message)
        self.message = message
        if status is not None:
            self.status = status


class InvalidArgument(RlkError, ValueError):
    """RLK_ERR_INVALID_ARGUMENT: a bad argument; the message names it."""
    status = 1


class Unsupported(RlkError):
    """RLK_ERR_UNSUPPORTED: valid, but not supported here (dtype, target, feature)."""
    status = 2


class Unavailable(RlkError):
    """RLK_ERR_UNAVAILABLE: a backend, compiler, device library or op is not present."""
    status = 3


class CompileError(RlkError):
    """RLK_ERR_COMPILE: the kernel compiler failed; the message holds its log."""
    status = 4


class JitDisabled(RlkError):
    """RLK_ERR_JIT_DISABLED: RLK_JIT=0 and the kernel is in no cache."""
    status = 5


class CacheError(RlkError):
    """RLK_ERR_CACHE: the kernel cache could not be used as configured."""
    status = 6


class BackendError(RlkError):
    """RLK_ERR_BACKEND: the device runtime reported an error."""
    status = 7


class OutOfMemory(RlkError, MemoryError):
    """RLK_ERR_OUT_OF_MEMORY."""
    status = 8


class RlkIOError(RlkError, OSError):
    """RLK_ERR_IO: a file could not be read or written."""
    status = 9


class Timeout(RlkError, TimeoutError):
    """RLK_ERR_TIMEOUT: a lock wait ran past RLK_LOCK_TIMEOUT_S."""
    status = 10


class InternalError(RlkError):
    """RLK_ERR_INTERNAL."""
    status = 11


class LibraryNotFound(Unavailable, ImportError):
    """librlk could not be found or loaded; the message lists where it was looked for."""


class AbiMismatch(RlkError):
    """The loaded librlk lays out a struct differently from this package's mirror of it."""


_BY_STATUS = {cls.status: cls for cls in (
    InvalidArgument, Unsupported, Unavailable, CompileError, JitDisabled, CacheError,
    BackendError, OutOfMemory, RlkIOError, Timeout, InternalError)}


def error_for_status(status, message):
    """The exception for a non-zero rlk_status, with `message` (rlk_last_error()) as its text."""
    cls = _BY_STATUS.get(int(status), RlkError)
    return cls(message or "rlk status %d" % int(status), int(status))
