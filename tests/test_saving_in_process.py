"""Saving in both conventions, and ranks whose weights differ, as simulated ranks.

Horovod's scripts save on rank 0 only; keras.io's save (and load back) on
every rank (`tfdist.strategies.state.save_records`). Ranks whose weights differ
stop with an error naming the variable, at an epoch end, at the end of `fit`
or at a save (`tfdist.strategies.state.replica_consistency`).
"""

import os

import keras
import numpy as np
import pytest

import tfdist
from tfdist.comm.simulated import SimulationError
from tfdist.simulation import simulate_processes
from tfdist.strategies.state.replica_consistency import ReplicasDiverged


def small_model(strategy):
    keras.utils.set_random_seed(3)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"),
                                  keras.layers.Dense(1, name="head")])
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    return model


def data(rows=45):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


class SaveEachEpoch(keras.callbacks.Callback):
    def __init__(self, directory):
        super().__init__()
        self.directory = directory

    def on_epoch_end(self, epoch, logs=None):
        self.model.save(os.path.join(self.directory, f"epoch{epoch + 1}.keras"))


def test_saves_on_rank_zero_only_never_wait_for_the_other_ranks(tmp_path):
    """Horovod's convention, every save kind: rank 0 writes and goes on; after a collective
    every rank reads rank 0's files."""
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        model = small_model(strategy)
        x, y = data()
        model.fit(x, y, batch_size=16, epochs=2, verbose=0,
                  callbacks=[SaveEachEpoch(str(tmp_path))] if rank == 0 else [])
        if rank == 0:
            model.save(str(tmp_path / "final.keras"))
            model.save_weights(str(tmp_path / "final.weights.h5"))
            model.export(str(tmp_path / "exported"), verbose=False)
        model.evaluate(x, y, verbose=0)  # a collective: rank 0's saves are done
        loaded = keras.models.load_model(str(tmp_path / "final.keras"))
        return [np.asarray(w) for w in loaded.get_weights()], model.get_weights()

    ranks = simulate_processes(2, run, timeout=90)
    for loaded, own in ranks:
        for a, b in zip(loaded, own):
            np.testing.assert_array_equal(a, b)
    assert {"epoch1.keras", "epoch2.keras", "final.keras", "final.weights.h5",
            "exported"} <= set(os.listdir(tmp_path))


def test_a_save_on_every_rank_returns_once_the_chiefs_file_is_there(tmp_path):
    """keras.io's convention: every rank saves, then loads the file back at once; the
    checkpoint, not tfdist's record, is the newest entry of its directory (keras.io resumes
    from `max(os.listdir(dir), key=os.path.getctime)`)."""
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        model = small_model(strategy)
        x, y = data()
        for epoch in range(2):
            model.fit(x, y, batch_size=16, epochs=1, verbose=0)
            model.save(str(tmp_path / f"ckpt-{epoch}.keras"))
            loaded = keras.models.load_model(str(tmp_path / f"ckpt-{epoch}.keras"))
            for a, b in zip(loaded.get_weights(), model.get_weights()):
                np.testing.assert_array_equal(a, b)
        return rank

    assert simulate_processes(2, run, timeout=90) == [0, 1]
    entries = [str(tmp_path / name) for name in os.listdir(tmp_path)]
    assert os.path.basename(max(entries, key=os.path.getctime)) == "ckpt-1.keras"


def test_ranks_saving_to_paths_of_their_own_wait_for_the_chiefs_save(tmp_path):
    """MultiWorkerMirroredStrategy's guide: the chief saves to the model's path, the others
    to temporary paths they then delete; every rank then loads the chief's file."""
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        model = small_model(strategy)
        x, y = data()
        model.fit(x, y, batch_size=16, epochs=1, verbose=0)
        model_path = str(tmp_path / "model.keras")
        own = model_path if rank == 0 else str(tmp_path / f"workertemp_{rank}" / "model.keras")
        model.save(own)
        if rank != 0:
            assert not os.path.exists(own)  # the chief writes
        loaded = keras.models.load_model(model_path)
        return all(np.array_equal(a, b) for a, b in zip(loaded.get_weights(),
                                                        model.get_weights()))

    assert simulate_processes(3, run, timeout=90) == [True, True, True]


def test_a_save_the_chief_never_makes_fails_clearly_on_the_rank_waiting_for_it(tmp_path):
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        model = small_model(strategy)
        if rank == 1:
            model.save(str(tmp_path / "only_rank_one.keras"))
        return rank

    with pytest.raises(SimulationError) as failure:
        simulate_processes(2, run, timeout=10)
    message = str(failure.value.__cause__)
    assert "tfdist rank 1: Model.save waited 10 s for the chief (rank 0)" in message
    assert "on the chief only" in message


def test_a_save_of_other_weights_than_the_chiefs_names_the_variables(tmp_path):
    def run(rank):
        strategy = tfdist.strategies.RingAllReduceStrategy()
        model = small_model(strategy)
        if rank == 1:
            model.get_layer("head").bias.assign([0.5])
        model.save_weights(str(tmp_path / "m.weights.h5"))
        return rank

    with pytest.raises(SimulationError) as failure:
        simulate_processes(2, run, timeout=15)
    assert isinstance(failure.value.__cause__, ReplicasDiverged)
    assert "head/bias differ" in str(failure.value.__cause__)


class DriftOnRankOne(keras.callbacks.Callback):
    """A rank-dependent assignment: rank 1 nudges a kernel at the end of epoch `epoch`."""

    def __init__(self, epoch):
        super().__init__()
        self.epoch = epoch

    def on_epoch_end(self, epoch, logs=None):
        if epoch == self.epoch and self.model.distribute_strategy.rank == 1:
            kernel = self.model.get_layer("head").kernel
            kernel.assign(kernel + 1e-6)


@pytest.mark.parametrize("epoch,where", [(0, "at the end of epoch 1"),
                                         (2, "at the end of fit")])
def test_ranks_that_drift_apart_stop_with_the_variable_named(epoch, where):
    """Found at the next step after an epoch end (the fingerprints ride its all-reduce) or by
    the check that ends `fit`, on every rank, naming the variable and the rank."""
    def run(rank):
        strategy = tfdist.strategies.ReductionTreeStrategy()
        model = small_model(strategy)
        x, y = data()
        try:
            model.fit(x, y, batch_size=16, epochs=3, verbose=0, callbacks=[DriftOnRankOne(epoch)])
        except ReplicasDiverged as error:
            return str(error)
        return "no error"

    messages = simulate_processes(3, run, timeout=90)
    for rank, message in enumerate(messages):
        assert message.startswith(f"tfdist rank {rank}: the ranks' weights differ {where}")
        assert "rank 1: sequential/head/kernel" in message, message


# --- hosts that share no disk: the chief's saves served to the others (chief_saves) --------
class _Weights:
    def __init__(self, whole):
        self.whole = whole


def test_a_rank_whose_disk_lacks_the_chiefs_file_copies_the_chiefs_bytes(tmp_path, monkeypatch):
    """The chief serves its completed saves; another host's rank copies what its disk does
    not hold (a missing or stale file, a SavedModel directory), leaves alone what it does (a
    shared file system), waits for a save not yet complete, and a stranger's request without
    the job's secret is refused."""
    import json
    import urllib.error
    import urllib.request

    from tfdist.comm import ports
    from tfdist.strategies.state import chief_saves

    monkeypatch.setenv("TFDIST_SECRET", "this job")
    chief_dir, other_dir = tmp_path / "chief", tmp_path / "other_host"
    chief_dir.mkdir()
    other_dir.mkdir()
    gone = []
    service = chief_saves.ChiefSaveService(ports.reserve_ports(1)[0], 2, 5.0, lambda: gone)
    client = chief_saves.ChiefSaveClient(f"127.0.0.1:{service.port}", 1, 5.0)
    chief_file = chief_dir / "model.keras"
    chief_file.write_bytes(os.urandom(3 * chief_saves.PIECE_BYTES // 2))  # two pieces
    service.completed(str(chief_file), whole=7, number=1)
    # Another host: its own path, a stale file there.
    mine = other_dir / "model.keras"
    mine.write_bytes(b"an older save")
    client.fetch(str(mine), _Weights(7), "Model.save", 1, lambda: False)
    assert mine.read_bytes() == chief_file.read_bytes()
    # A shared disk: the chief's own path holds the chief's file; nothing is written.
    before = os.stat(chief_file)
    client.fetch(str(chief_file), _Weights(7), "Model.save", 1, lambda: False)
    assert os.stat(chief_file).st_ino == before.st_ino
    # A SavedModel directory (Model.export).
    exported = chief_dir / "exported"
    (exported / "variables").mkdir(parents=True)
    (exported / "saved_model.pb").write_bytes(b"graph")
    (exported / "variables" / "variables.index").write_bytes(b"index")
    service.completed(str(exported), whole=8, number=2)
    client.fetch(str(other_dir / "exported"), _Weights(8), "Model.export", 2, lambda: False)
    assert (other_dir / "exported" / "variables" / "variables.index").read_bytes() == b"index"
    # Not saved yet: waits, and fails after the timeout naming the path; the chief gone: at once.
    with pytest.raises(TimeoutError, match="waited 0.5 s for the chief"):
        chief_saves.ChiefSaveClient(f"127.0.0.1:{service.port}", 1, 0.5).fetch(
            str(mine), _Weights(9), "Model.save", 3, lambda: False)
    with pytest.raises(TimeoutError, match="but the chief is gone"):
        client.fetch(str(mine), _Weights(9), "Model.save", 3, lambda: True)
    # A stranger (no signature) is refused; files the chief did not save are not served.
    query = f"http://127.0.0.1:{service.port}/read?path=/etc/passwd&offset=0&length=9"
    with pytest.raises(urllib.error.HTTPError, match="403"):
        urllib.request.urlopen(query, timeout=5)
    with pytest.raises(OSError, match="answered 400"):
        client._request("GET", "/read", path="/etc/passwd", relative="", offset=0, length=9)
    assert json.loads(client._request("GET", "/query", path=str(mine), whole=1,
                                      number=1))["state"] == chief_saves.PENDING
    # At exit the chief serves until the other rank said goodbye (or is gone).
    client.close()
    service.close()
