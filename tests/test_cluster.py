"""Cluster discovery: tfdist-run env, horovodrun env, TF_CONFIG, single process."""

import json

import pytest

from tfdist import cluster


def tf_config(cluster_spec, task_type, index):
    return json.dumps({"cluster": cluster_spec, "task": {"type": task_type, "index": index}})


def test_single_process_without_environment():
    c = cluster.discover({})
    assert (c.rank, c.world_size, c.launcher, c.is_chief) == (0, 1, "single", True)
    assert c.timeout == cluster.DEFAULT_TIMEOUT_SECONDS


def test_tfdist_run_environment():
    env = {
        "TFDIST_RANK": "2", "TFDIST_WORLD_SIZE": "3", "TFDIST_TIMEOUT": "42",
        "TFDIST_WORKER_ADDRESSES": "127.0.0.1:1000,127.0.0.1:1001,127.0.0.1:1002",
        "TFDIST_SERVER_ADDRESSES": "127.0.0.1:2000",
    }
    c = cluster.discover(env)
    assert (c.rank, c.world_size, c.launcher, c.timeout) == (2, 3, "tfdist-run", 42.0)
    assert c.worker_addresses[2] == "127.0.0.1:1002"
    assert c.server_addresses == ("127.0.0.1:2000",)
    assert not c.is_chief


def test_tfdist_run_server_role():
    env = {"TFDIST_ROLE": "server", "TFDIST_SERVER_INDEX": "0", "TFDIST_WORLD_SIZE": "1",
           "TFDIST_SERVER_ADDRESSES": "127.0.0.1:2000"}
    c = cluster.discover(env)
    assert c.is_server and c.server_index == 0 and not c.is_chief


def test_tfdist_run_takes_precedence_over_tf_config():
    env = {"TFDIST_RANK": "0", "TFDIST_WORLD_SIZE": "1",
           "TF_CONFIG": tf_config({"worker": ["a:1", "b:2"]}, "worker", 1)}
    assert cluster.discover(env).launcher == "tfdist-run"


def test_horovodrun_environment():
    c = cluster.discover({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1"})
    assert (c.rank, c.world_size, c.local_rank, c.launcher) == (1, 4, 1, "horovodrun")


@pytest.mark.parametrize("task_type,index,rank,role", [
    ("chief", 0, 0, "worker"),
    ("worker", 0, 1, "worker"),
    ("worker", 1, 2, "worker"),
    ("ps", 1, 0, "server"),
])
def test_tf_config_roles_and_ranks(task_type, index, rank, role):
    spec = {"chief": ["c:1"], "worker": ["w:1", "w:2"], "ps": ["p:1", "p:2"]}
    c = cluster.discover({"TF_CONFIG": tf_config(spec, task_type, index)})
    assert (c.rank, c.role, c.world_size) == (rank, role, 3)
    assert c.worker_addresses == ("c:1", "w:1", "w:2")
    assert c.server_addresses == ("p:1", "p:2")
    assert c.launcher == "TF_CONFIG"


def test_tf_config_without_chief_makes_worker_zero_the_chief():
    c = cluster.discover({"TF_CONFIG": tf_config({"worker": ["w:1", "w:2"]}, "worker", 0)})
    assert c.is_chief and c.world_size == 2


@pytest.mark.parametrize("text,field", [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "must be a JSON object"),
    (json.dumps({"task": {"type": "worker", "index": 0}}), "TF_CONFIG['cluster']"),
    (json.dumps({"cluster": {"worker": ["a:1"]}}), "TF_CONFIG['task']"),
    (tf_config({"worker": ["a:1"]}, "chief", 0), "TF_CONFIG['task']['type']"),
    (tf_config({"worker": ["a:1"]}, "worker", 3), "TF_CONFIG['task']['index']=3"),
    (tf_config({"worker": ["a:1"]}, "worker", "0"), "TF_CONFIG['task']['index']"),
    (tf_config({"worker": ["a:1", "nocolon"]}, "worker", 0), "TF_CONFIG['cluster']['worker'][1]"),
    (tf_config({"worker": ["a:1", "a:99999"]}, "worker", 0), "invalid address"),
    (tf_config({"worker": ["a:1", "a:1"]}, "worker", 0), "repeats address"),
    (tf_config({"worker": "a:1"}, "worker", 0), "non-empty list"),
    (tf_config({"chief": ["a:1", "b:2"]}, "chief", 0), "exactly one task"),
    (tf_config({"trainer": ["a:1"]}, "trainer", 0), "unknown job 'trainer'"),
    (tf_config({"ps": ["a:1"]}, "ps", 0), "nobody trains"),
    (tf_config({"worker": ["a:1"], "evaluator": ["e:1"]}, "evaluator", 0), "evaluator"),
])
def test_malformed_tf_config_names_the_field(text, field):
    with pytest.raises(ValueError) as error:
        cluster.discover({"TF_CONFIG": text})
    assert field in str(error.value)


@pytest.mark.parametrize("env,message", [
    ({"TFDIST_RANK": "x", "TFDIST_WORLD_SIZE": "2", "TFDIST_WORKER_ADDRESSES": "a:1,a:2"},
     "TFDIST_RANK must be an integer"),
    ({"TFDIST_RANK": "2", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1,a:2"}, "out of range"),
    ({"TFDIST_RANK": "0", "TFDIST_WORLD_SIZE": "2",
      "TFDIST_WORKER_ADDRESSES": "a:1"}, "lists 1 addresses"),
    ({"TFDIST_TIMEOUT": "-1"}, "must be positive"),
])
def test_bad_tfdist_environment(env, message):
    with pytest.raises(ValueError, match=message):
        cluster.discover(env)
