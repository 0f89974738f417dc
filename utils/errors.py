"""The base of every error a user can fix: the CLIs print its message on one line and exit non-zero."""


class UserError(Exception):
    """Bad input or set-up (a missing file, a malformed YAML, a device that does not exist).

    The message must say what is wrong and, where it can, what to do; it is printed alone,
    without a traceback.
    """
