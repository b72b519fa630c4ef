"""Device helpers: a library call leaves the process's settings as it found them."""

import torch

from tiedlm.device import cpu_threads, device_memory, resolve_device


def test_cpu_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    other = 1 if before != 1 else 2
    with cpu_threads(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with cpu_threads(0):  # 0: torch's default, left alone
        assert torch.get_num_threads() == before


def test_training_restores_the_thread_count(tiny, tmp_path):
    from tiedlm.train import train_run

    before = torch.get_num_threads()
    train_run(tiny("train.threads=1" if before != 1 else "train.threads=2"), out=tmp_path, progress=False)
    assert torch.get_num_threads() == before


def test_cpu_memory_is_known_and_positive():
    have, where = device_memory(resolve_device("cpu"))
    assert have is None or have > 2**20 and where
