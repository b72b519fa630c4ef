"""Run names a user can read: the family in words first (hf-qwen2, llama, from-START), then the
data, then the other settings, a long list cut and hashed, never a hash alone; runs named the old
way (set-HASH, arch=hf_hf_config=...) are carried on under their names."""

import pytest

import tiedlm.experiment as E
from tiedlm.config.naming import legacy_override_tag, override_tag
from tests.test_compare_config import fake_training  # noqa: F401  (a fixture)

QWEN2 = ["model.arch=hf", "model.hf_config=qwen2", "model.n_layer=4", "model.n_embd=64", "model.n_head=4",
         "model.n_kv_head=2", "model.intermediate_size=192", "model.bias=false"]


def test_a_family_override_is_named_in_words_before_the_settings():
    tag = override_tag(QWEN2)
    assert tag.startswith("-hf-qwen2-n_layer=4_n_embd=64") and "set-" not in tag
    assert tag.endswith("-" + tag.rsplit("-", 1)[1]) and len(tag) < 60  # the rest: how many, and a hash
    assert override_tag(["model.arch=hf", "model.hf_config=gpt_neox", "model.n_kv_head=2"]) \
        == "-hf-gpt_neox-n_kv_head=2"
    # tiedlm's own Llama-style block and transformers' Llama are two families, and two names
    assert override_tag(["model.arch=llama"]) == "-llama"
    assert override_tag(["model.arch=hf", "model.hf_config=llama"]) == "-hf-llama"
    # a file or a start: its name, and a hash of the path as written
    one, two = override_tag(["model.hf_config=a/config.json"]), override_tag(["model.hf_config=b/config.json"])
    assert one.startswith("-config-") and two.startswith("-config-") and one != two
    assert override_tag(["model.init_from=runs/adapt/export-tied"]).startswith("-from-export-tied-")
    assert override_tag(["data.path=my.txt", "model.arch=llama", "train.lr=1e-3"]).startswith("-llama-my-")


def test_a_long_list_keeps_what_fits_and_two_lists_never_share_a_name():
    a = override_tag(QWEN2)
    b = override_tag(QWEN2[:-1] + ["model.bias=true"])  # differs only in the part that was cut
    assert a != b and a.rsplit("+", 1)[0] == b.rsplit("+", 1)[0]
    assert override_tag(["model.n_embd=256", "train.lr=2e-3"]) == "-n_embd=256_lr=2e-3"  # short: as before


@pytest.mark.parametrize("overrides", [QWEN2[:1] + ["model.hf_config=gpt_neox", "model.n_embd=32"],
                                       ["model.n_embd=24", "model.n_head=2", "model.n_layer=1", "train.lr=3e-3",
                                        "train.weight_decay=0.05", "model.dropout=0.05"]])
def test_runs_named_the_old_way_are_carried_on_under_their_names(tmp_path, fake_training, tiny_yaml, overrides,  # noqa: F811
                                                                 capfd):
    runs = tmp_path / "runs"
    old, new = "tiny" + legacy_override_tag(overrides), "tiny" + override_tag(overrides)
    assert old != new
    first = E.compare_config(tiny_yaml, overrides, seeds=2, runs_dir=runs, progress=False, train=fake_training.train)
    assert sorted(r.name for r in first.runs) == sorted(f"{new}-{v}-s{s}" for v in ("tied", "untied") for s in (0, 1))
    for d in runs.glob(f"{new}-*"):  # as an earlier version named them
        d.rename(runs / d.name.replace(new, old))
    capfd.readouterr()
    fake_training.calls.clear()
    again = E.compare_config(tiny_yaml, overrides, seeds=3, runs_dir=runs, progress=False, train=fake_training.train)
    assert fake_training.calls == [f"{old}-tied-s2", f"{old}-untied-s2"]  # only the new seed is trained
    assert {r.name for r in again.runs} == {f"{old}-{v}-s{s}" for v in ("tied", "untied") for s in (0, 1, 2)}
    assert again.out == str(runs / f"compare-{old}")
    err = capfd.readouterr().err
    assert err.count(f"runs of these overrides are named {old}-… (as tiedlm named them before {new}-…)") == 1


def test_another_experiment_whose_names_begin_alike_does_not_hide_the_old_names(tmp_path, fake_training,  # noqa: F811
                                                                                  tiny_yaml):
    """The old runs of --set model.arch=llama (tiny-arch=llama-*) beside another experiment's new
    ones (tiny-llama-lr=0.01-*, whose names begin with this one's new prefix): carried on under the
    old names, not retrained under new ones."""
    runs = tmp_path / "runs"
    E.compare_config(tiny_yaml, ["model.arch=llama"], seeds=1, runs_dir=runs, progress=False, train=fake_training.train)
    for d in runs.glob("tiny-llama-*"):
        d.rename(runs / d.name.replace("tiny-llama", "tiny-arch=llama"))
    E.compare_config(tiny_yaml, ["model.arch=llama", "train.lr=0.01"], seeds=1, runs_dir=runs, progress=False,
                     train=fake_training.train)
    fake_training.calls.clear()
    E.compare_config(tiny_yaml, ["model.arch=llama"], seeds=2, runs_dir=runs, progress=False, train=fake_training.train)
    assert fake_training.calls == ["tiny-arch=llama-tied-s1", "tiny-arch=llama-untied-s1"]


def test_a_config_name_that_makes_the_run_names_too_long_is_refused_naming_the_fix(tmp_path, tiny_yaml):
    from typer.testing import CliRunner

    from tiedlm.cli import app

    long = ["--set", "name=" + "x" * 190, "--set", "model.arch=llama", "--set", "train.lr=0.001"]
    r = CliRunner().invoke(app, ["compare", "--config", str(tiny_yaml), *long, "--out", str(tmp_path / "runs")])
    assert r.exit_code == 2 and r.output.count("\n") == 1 and "most of them the config's name" in r.output
    assert r.output.rstrip().endswith("give the config a shorter name: --set name=NAME")
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_the_old_names_are_the_names_an_earlier_version_gave():
    """legacy_override_tag must keep giving the names runs were trained under: a hash alone of
    every override as typed (seed too) for a long list without data, the data's name first."""
    import hashlib

    def sha(text: str, n: int) -> str:
        return hashlib.sha256(text.encode()).hexdigest()[:n]

    assert legacy_override_tag(QWEN2) == "-set-" + sha(" ".join(QWEN2), 10)
    assert legacy_override_tag(["seed=3", *QWEN2]) == "-set-" + sha(" ".join(["seed=3", *QWEN2]), 10)
    assert legacy_override_tag(["seed=1", "data.path=my.txt", "model.arch=llama", "train.lr=1e-3"]) \
        == f"-my-{sha('data.path=my.txt', 8)}-arch=llama_lr=1e-3"
    assert legacy_override_tag(["data.path=my.txt", *QWEN2]) == f"-my-{sha('data.path=my.txt', 8)}-set-" \
        + sha(" ".join(QWEN2), 10)
    assert legacy_override_tag(["model.arch=hf", "model.hf_config=gpt_neox", "model.n_kv_head=2"]) \
        == "-arch=hf_hf_config=gpt_neox_n_kv_head=2"
