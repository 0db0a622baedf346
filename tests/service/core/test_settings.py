"""Settings from the environment: SMSO_ variables that no setting reads are named."""

from __future__ import annotations

import pytest

from service.core.settings import OTHER_VARIABLES, Settings, unknown_variables


@pytest.mark.parametrize(
    ("variable", "meant"),
    [
        ("SMSO_MAX_BATCH", "SMSO_MAX_BATCH_SIZE"),
        ("SMSO_DECODE_THREAD", "SMSO_DECODE_THREADS"),
        ("smso_apikey", "SMSO_API_KEY"),  # matched ignoring case, as the settings are
    ],
)
def test_a_misspelt_setting_is_named_with_the_closest_setting(variable, meant):
    (message,) = unknown_variables({variable: "1"})
    assert message.startswith(f"{variable} is not a setting of smso-serve and is ignored")
    assert f"did you mean {meant}?" in message


def test_a_name_close_to_no_setting_gets_no_guess():
    (message,) = unknown_variables({"SMSO_FOO": "1"})
    assert "did you mean" not in message
    assert "smso-serve --help" in message


def test_settings_and_the_projects_other_variables_are_not_named():
    environ = {f"SMSO_{name.upper()}": "1" for name in Settings.model_fields}
    environ |= {name: "1" for name in OTHER_VARIABLES}
    environ |= {"smso_max_wait_ms": "1", "HOME": "/root", "PATH": "/bin", "_SMSO_SESSION_HOST": "x"}
    assert unknown_variables(environ) == []


def test_kubernetes_service_links_are_not_named():
    links = {
        "SMSO_SERVICE_HOST": "10.0.0.1",
        "SMSO_SERVICE_PORT": "8000",
        "SMSO_SERVICE_PORT_HTTP": "8000",
        "SMSO_PORT_8000_TCP": "tcp://10.0.0.1:8000",
        "SMSO_PORT_8000_TCP_PROTO": "tcp",
        "SMSO_PORT_8000_TCP_PORT": "8000",
        "SMSO_PORT_8001_TCP_ADDR": "10.0.0.1",
    }
    assert unknown_variables(links) == []


def test_a_gallery_is_a_folder_of_the_one_model_file(tmp_path):
    from pydantic import ValidationError

    from service.cli import parse_args

    assert Settings(gallery_path=tmp_path).gallery_path == tmp_path
    with pytest.raises(ValidationError, match="does not exist; give the folder smso-index"):
        Settings(gallery_path=tmp_path / "nowhere")
    (tmp_path / "file").write_text("x")
    with pytest.raises(ValidationError, match="is a file, not a folder"):
        Settings(gallery_path=tmp_path / "file")
    with pytest.raises(ValidationError, match=r"beside its model.onnx \(<name>/<version>/gallery"):
        Settings(gallery_path=tmp_path, model_repository=tmp_path)
    # smso-serve --gallery GALLERY, or --gallery-path as every setting's flag
    assert parse_args(["--gallery", "g"]) == {"gallery_path": "g"}
    assert parse_args(["--gallery-path", "g"]) == {"gallery_path": "g"}
