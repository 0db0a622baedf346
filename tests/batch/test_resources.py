"""The Ray engine's CPU accounting: the defaults fit the cluster, and never hold the CPUs the
decode tasks need (an actor pool holding every CPU stalls the job for good)."""

from __future__ import annotations

import pytest

from batch.cli import main
from batch.engine import LARGE_MODEL_BYTES
from batch.ray_engine import ResourceError, Resources, check_resources, default_resources
from tests.batch.conftest import MODEL, write_pngs


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16, 64])
@pytest.mark.parametrize("gpus", [1, 4])
def test_gpu_actors_leave_cpus_to_the_decode_tasks(cpus, gpus):
    resources = default_resources(float(cpus), float(gpus))
    held = resources.actors * resources.actor_cpus
    assert not resources.decode_in_actors
    assert cpus - held >= min(1.0, cpus / 2)  # a decode task (half a CPU) can run
    assert resources.decode_cpus <= cpus - held
    assert (resources.actors, resources.actor_gpus) == (gpus, 1.0)
    check_resources(resources, float(cpus))


@pytest.mark.parametrize("cpus", [1, 2, 3, 4, 8, 16, 64])
def test_on_cpus_a_small_model_gets_an_actor_per_cpu_decoding_its_own_images(cpus):
    resources = default_resources(float(cpus), 0.0)
    assert resources.decode_in_actors
    assert (resources.actors, resources.actor_cpus, resources.threads) == (cpus, 1.0, 1)
    assert resources.actor_gpus == 0.0
    check_resources(resources, float(cpus))


@pytest.mark.parametrize(
    ("cpus", "actors", "actor_cpus", "threads"),
    [(1, 1, 1.0, 0), (2, 1, 2.0, 0), (4, 1, 4.0, 0), (8, 2, 4.0, 4), (18, 4, 4.0, 4)],
)
def test_on_cpus_a_large_model_gets_an_actor_per_four_cpus(cpus, actors, actor_cpus, threads):
    resources = default_resources(float(cpus), 0.0, model_bytes=LARGE_MODEL_BYTES)
    assert resources.decode_in_actors
    assert (resources.actors, resources.actor_cpus, resources.threads) == (
        actors,
        actor_cpus,
        threads,
    )
    check_resources(resources, float(cpus))


def test_the_actors_given_share_the_cpus():
    one, four = default_resources(2.0, 0.0, actors=1), default_resources(2.0, 0.0, actors=4)
    assert (one.actors, one.actor_cpus, one.threads) == (1, 2.0, 2)
    assert (four.actors, four.actor_cpus, four.threads) == (4, 0.5, 1)


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
    args += ["--actors", "3"]
    assert main([*args, "--actor-cpus", "1", "--batch-size", "1", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("smso-embed: 3 actors holding 1 CPUs each leave 0 of the cluster's")
    assert err.count("\n") == 1
