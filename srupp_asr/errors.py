"""Errors a user can cause (bad files, bad configs): the CLI prints them as one line, no traceback."""


class UserError(Exception):
    """A problem with the user's input; its message names the file or option and what is wrong."""
