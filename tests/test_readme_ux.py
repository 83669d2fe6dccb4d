"""The README's commands as a user runs them, shortened with overrides: what a helper's read-through found."""

import pytest

from transformer.cli import command


def test_train_without_a_config_names_only_the_config_as_required(capsys):
    # "transformer-train" alone said "the following arguments are required: config, overrides", though a
    # config alone runs, as the README's first training command does
    with pytest.raises(SystemExit) as stopped:
        command("train")([])
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert "required: config" in error and "overrides" not in error.splitlines()[-1]
