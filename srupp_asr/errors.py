"""Errors a user can cause (bad files, bad configs): the CLI prints them as one line, no traceback."""


class UserError(Exception):
    """A problem with the user's input; its message names the file or option and what is wrong."""


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (its type name when the message is empty)."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__
