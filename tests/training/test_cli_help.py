"""``smso-train --help`` and ``smso-eval --help``: every flag described, the valid values listed
from the registries, each default shown once and never as None."""

from __future__ import annotations

import argparse
import re

from training.backbones import BACKBONES
from training.config import build_parser
from training.datasets import DATASETS
from training.evaluate import build_parser as eval_parser
from training.heads import HEADS


def option_helps(parser: argparse.ArgumentParser) -> dict[str, str]:
    """Each option's help as ``--help`` prints it (joined onto one line), by its ``--`` flag."""
    text = " ".join(parser.format_help().split())
    helps = {}
    for action in parser._actions:
        if not action.option_strings or action.dest == "help":
            continue
        flag = next(s for s in action.option_strings if s[:2] == "--" and s[:5] != "--no-")
        assert action.help, f"{flag} has no help"
        formatter = parser._get_formatter()
        helps[flag] = " ".join(formatter._expand_help(action).split())
        assert helps[flag] in text, flag
    return helps


def check_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    helps = option_helps(parser)
    for flag, text in helps.items():
        assert "(default: None)" not in text, flag
        assert len(re.findall(r"\(default", text)) <= 1, f"{flag}: {text}"
    return helps


def test_every_smso_train_flag_has_help_and_shows_its_choices():
    helps = check_help(build_parser())
    for flag, names in (("--dataset", DATASETS), ("--backbone", BACKBONES), ("--head", HEADS)):
        assert all(name in helps[flag] for name in names), flag
    imagenet = [name for name, spec in BACKBONES.items() if spec.imagenet is not None]
    assert all(name in helps["--pretrained"] for name in imagenet)
    assert "local" in helps["--pretrained"]
    assert "10%" in helps["--val-size"]
    assert "splits.json" in helps["--val-size"]
    for flag in ("--schedule", "--loss", "--amp"):
        assert "one of:" in helps[flag], flag
    assert "(default: 30)" in helps["--epochs"]
    assert "(default: on)" in helps["--recalibrate"]


def test_every_smso_eval_flag_has_help():
    helps = check_help(eval_parser())
    assert "{train,val,test}" in eval_parser().format_help()
    assert "(default: 256)" in helps["--batch-size"]
