"""Where a comparison goes by default: a folder of its own per experiment (compare-NAME, NAME the
name its runs share), so that comparing one experiment never replaces another's comparison; the
folder compare wrote before (compare/) is neither a run nor replaced."""

import json
import shlex

from typer.testing import CliRunner

import tiedlm.compare as C
from tiedlm.cli import app
from tiedlm.config.naming import common_name
from tests.test_compare import TIED, UNTIED, make_pair, make_run
from tests.test_compare_config import fake_training  # noqa: F401  (a fixture)


def compared(folder) -> set:
    return {r["name"] for r in json.loads((folder / "comparison.json").read_text())["runs"]}


def test_the_name_runs_share_is_their_common_leading_parts_without_the_seed():
    assert common_name(["shakespeare-tied-s0", "shakespeare-untied-lr=0.01-s1"]) == "shakespeare"
    assert common_name(["shakespeare-my-1a2b3c4d-tied-s0", "shakespeare-my-1a2b3c4d-untied-s2"]) \
        == "shakespeare-my-1a2b3c4d"
    assert common_name(["x-tied-s0", "x-tied-s1"]) == "x-tied"  # only tied runs: a comparison of its own
    assert common_name(["gpt2-tied-s0", "llama-untied-s0"]) == "gpt2+llama"  # nothing in common
    assert common_name(["a" * 30 + "-s0", "b" * 30 + "-s0"]).startswith("2-runs-")


def test_two_experiments_in_one_runs_folder_keep_their_own_comparisons(tmp_path, fake_training, tiny_yaml):  # noqa: F811
    import tiedlm.experiment as E

    runs = tmp_path / "runs"
    main = E.compare_config(tiny_yaml, [], seeds=2, runs_dir=runs, progress=False, train=fake_training.train)
    own = E.compare_config(tiny_yaml, ["model.n_embd=24"], seeds=2, runs_dir=runs, progress=False,
                           train=fake_training.train)
    assert main.out == str(runs / "compare-tiny") and own.out == str(runs / "compare-tiny-n_embd=24")
    assert compared(runs / "compare-tiny") == {"tiny-tied-s0", "tiny-tied-s1", "tiny-untied-s0", "tiny-untied-s1"}
    assert compared(runs / "compare-tiny-n_embd=24") == {f"tiny-n_embd=24-{v}-s{s}" for v in ("tied", "untied")
                                                         for s in (0, 1)}
    # every run of the folder, judged: their shared name is tiny, whose folder holds the first
    # experiment's comparison; it is kept, and this one goes to a folder named for its runs
    r = CliRunner().invoke(app, ["compare", "--out", str(runs)])
    assert r.exit_code == 0, r.output
    assert compared(runs / "compare-tiny") == {"tiny-tied-s0", "tiny-tied-s1", "tiny-untied-s0", "tiny-untied-s1"}
    (everything,) = [p for p in runs.glob("compare-tiny-*") if p.name != "compare-tiny-n_embd=24"]
    assert len(compared(everything)) == 8
    assert f"{runs / 'compare-tiny'} holds a comparison of other runs, left as it is: this one is in {everything}" \
        in r.output and "give --into DIR" in r.output
    # the same runs again go to the same folder, and the config's own comparison back to its own
    again = CliRunner().invoke(app, ["compare", "--out", str(runs)])
    assert f"wrote {everything}/comparison.md" in again.output and "holds a comparison" not in again.output
    assert E.compare_config(tiny_yaml, [], seeds=2, runs_dir=runs, progress=False,
                            train=fake_training.train).out == str(runs / "compare-tiny")


def test_into_names_the_folder_and_the_old_compare_folder_is_left_alone(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    old = runs / "compare"  # where every comparison went before compare-NAME/
    old.mkdir()
    (old / "comparison.json").write_text('{"runs": [{"name": "earlier-s0"}]}')
    r = CliRunner().invoke(app, ["compare", "--out", str(runs), "--into", str(tmp_path / "mine")])
    assert r.exit_code == 0, r.output
    assert compared(tmp_path / "mine") == {"base-tied-s0", "base-tied-s1", "base-untied-s0", "base-untied-s1"}
    assert not (runs / "compare-base").exists()
    c = C.compare_runs(runs_dir=runs)  # the folder's runs: compare/ is not one of them
    assert c.out == str(runs / "compare-base") and {r.name for r in c.runs} == compared(tmp_path / "mine")
    assert (old / "comparison.json").read_text() == '{"runs": [{"name": "earlier-s0"}]}'
    # a glob over the runs folder takes no comparison folder for a run
    c = C.compare_runs([str(runs / "*")], runs_dir=runs)
    assert not [s for s in c.skipped if s.name.startswith("compare")], c.skipped


def test_a_subset_of_an_experiments_runs_does_not_replace_its_comparison(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0, 57.5], [59.0, 60.0, 60.5])
    make_run(runs, "base-tied-s9", 9, TIED, val=57.0)
    make_run(runs, "base-untied-s9", 9, UNTIED, val=59.5)
    whole = C.compare_runs(runs_dir=runs)
    part = C.compare_runs([runs / "base-tied-s0", runs / "base-untied-s0", runs / "base-tied-s1",
                           runs / "base-untied-s1"], runs_dir=runs)
    assert whole.out == str(runs / "compare-base") and part.out != whole.out
    assert part.out.startswith(str(runs / "compare-base-")) and len(compared(runs / "compare-base")) == 8


def test_a_run_folder_is_no_comparison_folder_and_a_comparison_no_run(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    before = sorted(p.name for p in (runs / "base-tied-s0").iterdir())
    r = CliRunner().invoke(app, ["compare", "--out", str(runs), "--into", str(runs / "base-tied-s0")])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"{runs / 'base-tied-s0'} is the folder of the run base-tied-s0" in r.output and "--into" in r.output
    assert sorted(p.name for p in (runs / "base-tied-s0").iterdir()) == before
    C.compare_runs(runs_dir=runs)
    r = CliRunner().invoke(app, ["compare", str(runs / "compare-base")])
    assert r.exit_code == 2 and r.output.count("\n") == 1, r.output
    assert f"{runs / 'compare-base'} is a comparison's folder, not a run — compare its runs instead" in r.output
    fix = r.output.split("(tiedlm compare ", 1)[1].split(")", 1)[0]  # typed as written: the runs it compared
    assert CliRunner().invoke(app, ["compare", *shlex.split(fix)]).exit_code == 0


def test_into_a_run_s_managed_part_names_into(tmp_path):
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    (runs / "base-tied-s0" / "checkpoints").mkdir(exist_ok=True)
    r = CliRunner().invoke(app, ["compare", "--out", str(runs), "--into", str(runs / "base-tied-s0" / "checkpoints" / "x")])
    assert r.exit_code == 2 and r.output.startswith(f"tiedlm: error: --into {runs / 'base-tied-s0' / 'checkpoints' / 'x'}")


def test_a_comparison_written_while_waiting_for_the_folder_is_kept(tmp_path, monkeypatch):
    """Two compares of different runs with one shared name, at once: the second chose its folder,
    waited for the first to write it, and replaced it. The folder is chosen again once held."""
    import contextlib

    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    held = []

    @contextlib.contextmanager
    def lock(folder):
        if not held:  # the other command wrote its comparison of other runs while this one waited
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "comparison.json").write_text('{"runs": [{"name": "base-tied-s0"}]}')
        held.append(folder)
        yield

    monkeypatch.setattr(C, "FolderLock", lock)
    c = C.compare_runs(runs_dir=runs)
    assert held[0] == runs / "compare-base" and c.out == str(held[-1]) != str(held[0])
    assert (runs / "compare-base" / "comparison.json").read_text() == '{"runs": [{"name": "base-tied-s0"}]}'


def test_compare_config_keeps_a_comparison_of_other_runs_in_its_folder(tmp_path, fake_training, tiny_yaml):  # noqa: F811
    import tiedlm.experiment as E

    runs = tmp_path / "runs"
    make_run(runs, "tiny-tie_embeddings=true-arch=llama-s0", 0, TIED, val=57.0)  # a sweep's runs, compared by name
    make_run(runs, "tiny-tie_embeddings=false-arch=llama-s0", 0, UNTIED, val=59.0)
    swept = C.compare_runs(runs_dir=runs)
    assert swept.out == str(runs / "compare-tiny")
    mine = E.compare_config(tiny_yaml, [], seeds=1, runs_dir=runs, progress=False, train=fake_training.train)
    assert mine.out != swept.out and mine.out.startswith(str(runs / "compare-tiny-"))
    assert compared(runs / "compare-tiny") == {"tiny-tie_embeddings=true-arch=llama-s0",
                                               "tiny-tie_embeddings=false-arch=llama-s0"}
    assert mine.replaced.startswith(f"{runs / 'compare-tiny'} holds a comparison of other runs, left as it is")
    again = E.compare_config(tiny_yaml, [], seeds=2, runs_dir=runs, progress=False, train=fake_training.train)
    assert again.out == mine.out and again.replaced is None


def test_runs_named_elsewhere_are_compared_beside_themselves(tmp_path, monkeypatch):
    """Runs given by path, with no --out: the comparison goes to the folder they lie in, not to a
    runs/ of the working directory; runs of several folders, and an --out, go where they did."""
    runs = tmp_path / "my runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    r = CliRunner().invoke(app, ["compare", str(runs / "base-*")])
    assert r.exit_code == 0 and f"wrote {runs / 'compare-base'}/comparison.md" in r.output, r.output
    assert not (work / "runs").exists()
    r = CliRunner().invoke(app, ["compare", str(runs / "base-*"), "--out", str(work / "mine")])
    assert r.exit_code == 0 and (work / "mine" / "compare-base" / "comparison.json").is_file()


def test_a_run_named_compare_is_compared(tmp_path):
    """compare/ was every comparison's folder before compare-NAME/, and was skipped by its name; a
    run of that name (tiedlm train --name compare) was left out without a word."""
    runs = tmp_path / "runs"
    make_pair(runs, [57.0, 58.0], [59.0, 60.0])
    make_run(runs, "compare", 2, TIED, val=57.5)
    assert "compare" in {r.name for r in C.compare_runs(runs_dir=runs).runs}
