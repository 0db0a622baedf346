"""argparse help that shows each option's default once: what every console script's parser and
the training config's parser (``smso-train``) format their ``--help`` with."""

from __future__ import annotations

import argparse

__all__ = ["HelpFormatter"]


class HelpFormatter(argparse.HelpFormatter):
    """Appends ``(default: X)`` to an option's help where X is a value (not None or False) and
    the help does not already say its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        default = action.default
        if (
            action.option_strings
            and "default" not in text
            and default is not argparse.SUPPRESS
            and default is not None
            and default is not False
        ):
            text += " (default: %(default)s)"
        return text
