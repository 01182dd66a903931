"""errors - ferry's error codes as Python exceptions.

System errors (the library's -errno codes) become OSError with that errno (so
FileNotFoundError for ENOENT, ...), the library's message as strerror and the
file as filename. ferry's own codes (below -4096) become FerryError subclasses
carrying the code and the library's one-line message, which names the file.
"""
from . import _lib


class FerryError(Exception):
    """An error reported by libferry. Attributes: code (the negative FERRY_E_*
    value), message (ferry_ctx_errmsg's text, or ferry_strerror's when the
    library left none) and filename (the file or device the call was about)."""

    def __init__(self, code, message, filename=None):
        self.code = code
        self.message = message
        self.filename = filename
        text = message
        if filename and str(filename) not in message:
            text = f"{filename}: {message}"
        super().__init__(text)

    @property
    def strerror(self):
        """ferry_strerror's static name of the code."""
        return _lib.strerror(self.code)


class FormatError(FerryError):
    """The file is not a checkpoint ferry reads, or breaks its format's rules
    (FERRY_E_FORMAT, FERRY_E_CORRUPT)."""


class UnsupportedError(FormatError):
    """Valid, but uses a feature ferry (or this framework) does not read
    (FERRY_E_UNSUPPORTED), e.g. a dtype torch lacks."""


class LimitError(FormatError):
    """Beyond one of ferry's size limits, e.g. a header over 100 MB (FERRY_E_LIMIT)."""


class InvalidArgumentError(FerryError, ValueError):
    """A bad argument (FERRY_E_INVAL)."""


class NotFoundError(FerryError, LookupError):
    """No such tensor (FERRY_E_NOTFOUND)."""


class BudgetError(FerryError):
    """A memory budget would be exceeded (FERRY_E_BUDGET)."""


class NoDeviceError(FerryError):
    """No such device, or no usable driver (FERRY_E_NODEV)."""


class DeviceError(FerryError):
    """The device driver failed a call (FERRY_E_DEVICE)."""


class InternalError(FerryError):
    """A bug in ferry (FERRY_E_INTERNAL): please report it."""


_CLASSES = {
    _lib.E_CORRUPT: FormatError,
    _lib.E_FORMAT: FormatError,
    _lib.E_UNSUPPORTED: UnsupportedError,
    _lib.E_LIMIT: LimitError,
    _lib.E_INVAL: InvalidArgumentError,
    _lib.E_NOTFOUND: NotFoundError,
    _lib.E_BUDGET: BudgetError,
    _lib.E_NODEV: NoDeviceError,
    _lib.E_DEVICE: DeviceError,
    _lib.E_INTERNAL: InternalError,
}


def error(code, message, filename=None):
    """The exception for a negative ferry return code."""
    message = message or _lib.strerror(code)
    if _lib.is_system_error(code):
        # OSError(errno, strerror, filename) picks FileNotFoundError etc. and
        # appends the file name itself: drop the library's own "path: " prefix.
        if filename is not None:
            prefix = f"{filename}: "
            if message.startswith(prefix):
                message = message[len(prefix):]
        return OSError(-code, message, filename)
    return _CLASSES.get(code, FerryError)(code, message, filename)


def check(code, ctx, filename=None):
    """Return code when it is >= 0, else raise the exception for it with the
    message ferry left on ctx."""
    if code >= 0:
        return code
    raise error(code, _lib.errmsg(ctx), filename)
