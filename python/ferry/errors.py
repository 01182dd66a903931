# SPDX-License-Identifier: Apache-2.0
"""errors - ferry's error codes as Python exceptions.

System errors (the library's -errno codes) become OSError with that errno (so
FileNotFoundError for ENOENT, ...), the library's message as strerror and the
file as filename. ferry's own codes (below -4096) become FerryError subclasses
carrying the code and the library's one-line message, which names the file.
The codes and their names come from the library (ferry_error_name); the
classes are picked by name, and a code this module has no class for is a
plain FerryError.
"""
from . import _lib


class FerryError(Exception):
    """An error reported by libferry. Attributes: code (the negative FERRY_E_*
    value), message (the message the library left on the handle the call was
    made on, or on its context, or ferry_strerror's when it left none) and
    filename (the file or device the call was about)."""

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

    @property
    def name(self):
        """ferry_error_name of the code ("BUSY" for FERRY_E_BUSY), or None."""
        return _lib.error_name(self.code)


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


class BusyError(InvalidArgumentError):
    """In use (FERRY_E_BUSY): evicting or removing a tensor held by a forward
    pass or store.use(), opening a job while one is open. A subclass of
    InvalidArgumentError because the library reported these as FERRY_E_INVAL
    before it had this code: code written to catch that keeps working."""


# ferry_error_name -> class; the library's codes are mapped through their names
_BY_NAME = {
    "CORRUPT": FormatError,
    "FORMAT": FormatError,
    "UNSUPPORTED": UnsupportedError,
    "LIMIT": LimitError,
    "INVAL": InvalidArgumentError,
    "NOTFOUND": NotFoundError,
    "BUDGET": BudgetError,
    "NODEV": NoDeviceError,
    "DEVICE": DeviceError,
    "INTERNAL": InternalError,
    "BUSY": BusyError,
}

_CLASSES = {code: _BY_NAME.get(name, FerryError) for code, name in _lib.ERROR_NAMES.items()}
"""Every FERRY_E_* code the loaded library has -> the exception class raised for it."""


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
    message ferry left on ctx (for calls made on a context: opening a file or
    a device)."""
    if code >= 0:
        return code
    raise error(code, _lib.errmsg(ctx), filename)


def check_on(code, errmsg, handle, filename=None):
    """Return code when it is >= 0, else raise the exception for it with the
    message ferry left on the handle the call was made on: errmsg is one of
    _lib.file_errmsg, device_errmsg, store_errmsg, model_errmsg."""
    if code >= 0:
        return code
    raise error(code, errmsg(handle), filename)
