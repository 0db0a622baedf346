"""``smso-export --help`` and ``--name``/``--version``: described flags, checked names."""

from __future__ import annotations

import pytest

from export.card import check_served_name
from export.cli import build_parser
from export.cli import main as export_main
from tests.training.test_cli_help import check_help


def test_every_smso_export_flag_has_help_and_shows_its_choices():
    helps = check_help(build_parser())
    assert {"--name", "--version", "--form", "--output", "--data-root"} <= set(helps)
    assert "{conv,covariance,auto}" in build_parser().format_help()
    assert "(default: 18)" in helps["--opset"]


@pytest.mark.parametrize("name", ["leaves", "my-model.v2", "A_1"])
def test_a_url_segment_is_a_valid_served_name(name):
    assert check_served_name(name, "the served name") == name


@pytest.mark.parametrize("name", ["", "a/b", "..", "café", "a b", "x" * 129, "a?b"])
def test_other_names_are_refused_with_what_is_allowed(name):
    with pytest.raises(ValueError, match=r"letters, digits, '_', '\.' or '-'"):
        check_served_name(name, "the served name")


def test_a_bad_name_is_one_error_line_before_any_work(tmp_path, capsys):
    assert export_main([str(tmp_path / "missing.pt"), "--name", "my model"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("smso-export: error: the served name 'my model' must be")
    assert "\n" not in err
