"""The root of every foreseeable failure, so the CLI can print it cleanly instead of a traceback."""


class VerilocoError(Exception):
    """A failure a user can act on: the message says what is wrong and what to do.

    Each package boundary has its own subclass (formats, store, chain, trainer, ...); the CLI turns
    any of them into one line on stderr and exit status 2.
    """
