"""The tie as one value (tiedlm/model/tie.py): configs of either form hash as they did before the value
existed, stored run folders load, the Tie answers each question once (lowrank at rank 0: W_out is
E, in the model, analysis and export alike), one function loads weights in every form, the model
names its embedding parameters, and no module but config/__init__.py, model/tie.py and runs/ reads the tie's
stored fields."""

import ast
import dataclasses
from pathlib import Path

import pytest
import torch

from tiedlm import runs
from tiedlm.runs.checkpoints import load_weights
from tiedlm.config import ModelConfig, Tie, from_dict, load_config, to_yaml
from tiedlm.config.identity import config_hash
from tiedlm.model.blocks import GPT, model_tensors
from tiedlm.model.tie import UNTIED

# config_hash of these configs, computed before the Tie existed: a change to how the tie is parsed
# or stored that moves a hash orphans every run folder of that variant.
HASHES = {
    (): "d11edfe854b352d7",
    ("model.tie_embeddings=true",): "d11edfe854b352d7",
    ("model.tie_embeddings=false",): "422ab0a2b293a125",
    ("model.tie_mode=tied",): "d11edfe854b352d7",
    ("model.tie_mode=untied",): "422ab0a2b293a125",
    ("model.tie_embeddings=true", "model.tie_mode=tied"): "d11edfe854b352d7",
    ("model.tie_embeddings=false", "model.tie_mode=untied"): "422ab0a2b293a125",
    ("model.tie_mode=projection",): "41e87e3694b5391e",
    ("model.tie_embeddings=true", "model.tie_mode=projection"): "41e87e3694b5391e",
    ("model.tie_mode=lowrank", "model.untie_rank=8"): "6d4c391f980ad239",
    ("model.tie_mode=lowrank", "model.untie_rank=0"): "8d20e3e7c4508d21",
    ("model.tie_mode=lowrank", "model.untie_rank=8", "model.tie_embeddings=false"): "422ab0a2b293a125",
    ("model.untie_at=0.5",): "984d4ab9578decc7",
}
SHAKESPEARE = {(): "94e3b6efebda39c9", ("model.tie_embeddings=false",): "2816d00b0dde4c53",
               ("model.tie_mode=lowrank", "model.untie_rank=8"): "cb1f65ab707a6189"}
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("overrides", list(HASHES))
def test_old_configs_hash_as_before(overrides):
    assert config_hash(load_config(None, ["train.max_steps=10", *overrides])) == HASHES[overrides]


@pytest.mark.parametrize("overrides", list(SHAKESPEARE))
def test_the_main_jobs_config_hashes_as_before(overrides):
    assert config_hash(load_config(ROOT / "configs" / "shakespeare.yaml", list(overrides))) == SHAKESPEARE[overrides]


@pytest.mark.parametrize("model,tie,want", [
    ({"tie_embeddings": False}, UNTIED, "422ab0a2b293a125"),  # written before the modes existed
    ({"tie_embeddings": True, "untie_at": None, "tie_mode": None, "untie_rank": 0}, Tie("tied"), "d11edfe854b352d7"),
    ({"tie_embeddings": False, "tie_mode": None, "untie_rank": 0}, UNTIED, "422ab0a2b293a125"),
    ({"tie_embeddings": True, "tie_mode": "lowrank", "untie_rank": 4}, Tie("lowrank", 4), "b73b3f90bbacc75b"),
])
def test_stored_run_configs_load_with_their_tie_and_hash(tmp_path, model, tie, want):
    import yaml

    (tmp_path / runs.CONFIG).write_text(yaml.safe_dump({"model": model, "train": {"max_steps": 10}}))
    cfg = runs.read_config(tmp_path)
    assert cfg.model.tie == tie and config_hash(cfg) == want
    assert config_hash(from_dict(yaml.safe_load(to_yaml(cfg)))) == want  # and the folder it writes, again


def test_a_config_stores_the_tie_in_its_old_fields():
    cfg = load_config(None, ["train.max_steps=10", "model.tie_mode=untied"])
    assert (cfg.model.tie_embeddings, cfg.model.tie_mode, cfg.model.untie_rank) == (False, None, 0)
    assert "tie_embeddings: false" in to_yaml(cfg) and "tie_mode: null" in to_yaml(cfg)
    for tie in (Tie("tied"), UNTIED, Tie("projection"), Tie("lowrank", 8), Tie("lowrank", 0),
                Tie("soft", strength=0.5)):
        assert ModelConfig().with_tie(tie).tie == tie


# ---------------------------------------------------------------------------- what the Tie answers


@pytest.mark.parametrize("tie,label,tag,is_e,two,built,params", [
    (Tie("tied"), "tied", "tied", True, False, False, 0),
    (UNTIED, "untied", "untied", False, True, False, 97 * 16),
    (Tie("projection"), "projection", "projection", False, False, True, 16 * 16),
    (Tie("lowrank", 8), "lowrank r=8", "lowrank-r8", False, False, True, 8 * (97 + 16)),
    (Tie("lowrank", 0), "lowrank r=0", "lowrank-r0", True, False, True, 0),
    (Tie("soft", strength=0.01), "soft λ=0.01", "soft-l0.01", False, True, False, 97 * 16),
    (Tie("soft", strength=1e-5), "soft λ=1e-05", "soft-l1e-05", False, True, False, 97 * 16),
])
def test_the_tie_answers_each_question(tie, label, tag, is_e, two, built, params):
    assert (tie.label, tie.tag, tie.w_out_is_e, tie.two_matrices, tie.built_from_e) == (label, tag, is_e, two, built)
    assert tie.head_params(97, 16) == params
    assert tie.stored_mode == (tie.mode if built or tie.mode == "soft" else None)
    assert Tie.stored(**tie.fields()) == tie


def build(tie, V=97):
    torch.manual_seed(0)
    return GPT(ModelConfig(n_layer=1, n_head=2, n_embd=16, block_size=8).with_tie(tie), V)


def lowrank_run(tmp_path, rank):
    """A folder with only a lowrank config.yaml: what analyze checks before it reads weights."""
    cfg = load_config(None, ["train.max_steps=10", "model.tie_mode=lowrank", f"model.untie_rank={rank}"])
    folder = tmp_path / f"r{rank}"
    folder.mkdir()
    (folder / runs.CONFIG).write_text(to_yaml(cfg))
    return folder


@pytest.mark.parametrize("rank,is_e", [(0, True), (4, False)])
def test_lowrank_at_rank_zero_is_e_in_the_model_analysis_and_export_alike(tmp_path, rank, is_e):
    from tiedlm.analyze import _may_be_untied
    from tiedlm.export import writes_tied

    model = build(Tie("lowrank", rank))
    assert model.w_out_is_e is is_e and writes_tied(model) is is_e
    assert _may_be_untied(lowrank_run(tmp_path, rank)) is not is_e


def test_a_lowrank_run_at_rank_zero_exports_tied(tmp_path):
    pytest.importorskip("transformers")
    from tests.test_export import BASE
    from tiedlm.export import export_run, summary
    from tiedlm.train import train_run

    run = train_run(load_config(None, BASE + ["model.tie_mode=lowrank", "model.untie_rank=0"]), out=tmp_path,
                    name="zero", progress=False)
    result = export_run(run, tmp_path / "hf")
    assert result.verified and result.tied and result.mode == "lowrank" and "written tied" in summary(result)


def test_the_current_tie_is_untied_once_split():
    model = build(Tie("tied"))
    assert model.current_tie == Tie("tied")
    model.untie()
    assert model.current_tie == UNTIED and model.built_tie == Tie("tied") and not model.w_out_is_e


# ---------------------------------------------------------------------------- weights and the optimizer


@pytest.mark.parametrize("tie", [Tie("tied"), UNTIED, Tie("projection"), Tie("lowrank", 4), Tie("soft", strength=1.0)])
def test_the_model_names_its_embedding_parameters(tie):
    model = build(tie)
    t = model.transformer
    want = [t.wte.weight, t.wpe.weight] + ([model.lm_head.weight] if tie.two_matrices else [])
    want += [model.head_a, model.head_b] if tie.mode == "lowrank" else []
    assert [id(p) for p in model.embedding_parameters()] == [id(p) for p in want]


def stored(model):
    tensors, meta = model_tensors(model)
    return {k: v.clone() for k, v in tensors.items()}, {"tied": meta["tied"]}


def test_one_function_loads_weights_in_every_form():
    x = torch.randint(0, 97, (2, 8))
    source = build(Tie("tied"))
    with torch.no_grad():
        source.transformer.wte.weight.add_(1.0)
    one = stored(source)
    tied = build(Tie("tied"))
    load_weights(tied, *one)  # one matrix into a tied model: still one Parameter
    assert tied.is_tied and torch.equal(tied(x), source(x))
    split = build(Tie("tied"))
    split.untie()
    load_weights(split, *one)  # weights kept before an untie_at split: E fills both matrices
    assert not split.is_tied and torch.equal(split(x), source(x))
    source.untie()
    with torch.no_grad():
        source.lm_head.weight.mul_(0.5)
    two = stored(source)
    rebuilt = build(Tie("tied"))
    load_weights(rebuilt, *two)  # two matrices into a model built tied from its config: split first
    assert not rebuilt.is_tied and torch.equal(rebuilt(x), source(x))


# ---------------------------------------------------------------------------- nobody else decides

STORED = {f.name for f in dataclasses.fields(ModelConfig)
          if f.name in ("tie_embeddings", "tie_mode", "untie_rank", "tie_strength")}
OWNERS = {"config/__init__.py", "config/layers.py", "model/tie.py", "runs/record.py", "runs/layout.py"}  # the parsing, layering and storing rules, the value, old folders
# Modules being rewritten beside this change, that still build their variants from the stored fields
# (the run tag, the plain tied variant's overrides): they switch to Tie.tag and Tie.built_from_e.
SWITCHING: set[str] = set()


def stored_field_reads(source: str) -> list[str]:
    """`expression` of each read of a stored tie field (`m.tie_mode`) and each keyword that sets one
    (`replace(m, tie_embeddings=True)`)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and node.attr in STORED:
            found.append(ast.unparse(node))
        elif isinstance(node, ast.keyword) and node.arg in STORED:
            found.append(f"{node.arg}={ast.unparse(node.value)}")
    return found


def test_no_module_but_the_owners_reads_the_stored_tie():
    assert STORED == {"tie_embeddings", "tie_mode", "untie_rank", "tie_strength"}
    assert stored_field_reads("a = cfg.model.tie_embeddings\nb = replace(m, tie_mode=None)\nc = m.tie.label\n") == [
        "cfg.model.tie_embeddings", "tie_mode=None"]
    package = ROOT / "tiedlm"
    found = [f"{path.relative_to(package)}: {read}" for path in sorted(package.rglob("*.py"))
             if str(path.relative_to(package)) not in OWNERS | SWITCHING
             for read in stored_field_reads(path.read_text())]
    assert found == []


def test_every_mode_has_its_own_cost_words():
    """tiedlm params' sentence on what a mode adds to the FLOPs comes from the tie, one per mode:
    projection's words are projection's alone (a mode without words would be a KeyError)."""
    from tiedlm.model.tie import MODES, RANKED, STRENGTHENED, Tie

    words = {}
    for mode in MODES:
        kw = {"rank": 4} if mode in RANKED else {"strength": 0.1} if mode in STRENGTHENED else {}
        words[mode] = Tie(mode, **kw).cost_words(2048, 2)
    assert len({words[m] for m in MODES if m not in ("tied", "untied")}) == len(MODES) - 2
    assert words["projection"] == "P h: 2d² more per token" and "2,048 tokens" in words["lowrank"]
    assert "4,096 tokens" in words["soft"] and "4,096 tokens" in words["pull"]
