"""The Ray engine's CPU accounting: the default actors never hold the CPUs the decode tasks need
(an actor pool holding every CPU stalls the job for good)."""

from __future__ import annotations

import pytest

from batch.cli import main
from batch.ray_engine import ResourceError, Resources, check_resources, default_resources
from tests.batch.conftest import MODEL, write_pngs


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("gpus", [0, 1, 4])
def test_the_actors_leave_cpus_to_the_decode_tasks(cpus, gpus):
    resources = default_resources(float(cpus), float(gpus))
    held = resources.actors * resources.actor_cpus
    assert cpus - held >= min(1.0, cpus / 2)  # a decode task (half a CPU) and a write can run
    assert resources.decode_cpus <= cpus - held
    assert resources.actors == (gpus or max(1, cpus // 4))
    assert resources.actor_gpus == (1.0 if gpus else 0.0)


def test_two_cpus_one_actor_on_both_cores():
    resources = default_resources(2.0, 0.0)
    assert (resources.actors, resources.actor_cpus, resources.threads) == (1, 1.0, 0)


def test_actors_holding_every_cpu_are_refused_before_the_job_waits_forever():
    held = Resources(2, 1.0, 0.0, 1, 0.5)
    with pytest.raises(ResourceError, match="would wait forever"):
        check_resources(held, 2.0)
    with pytest.raises(ResourceError, match="would wait forever"):
        check_resources(Resources(3, 1.0, 0.0, 1, 0.5, decode_in_actors=True), 2.0)
    check_resources(Resources(1, 1.0, 0.0, 0, 0.5), 2.0)
    # decoding in the actors, nothing else needs a CPU: the driver writes the parts
    check_resources(Resources(2, 1.0, 0.0, 1, 0.5, decode_in_actors=True), 2.0)


def test_the_command_says_so_in_one_line(ray_cluster, tmp_path, capsys):
    write_pngs(tmp_path / "in", 2)
    args = [MODEL, str(tmp_path / "in"), "-o", str(tmp_path / "o"), "--engine", "ray"]
    args += ["--actors", "2"]
    assert main([*args, "--actor-cpus", "1", "--batch-size", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smso-embed: 2 actors holding 1 CPUs each")
    assert err.count("\n") == 1
