"""Config loading: defaults, base inheritance, overrides, validation, hashing; every shipped config."""

from pathlib import Path

import pytest

from tiedlm.config import ALL_KEYS, load_config, to_dict, to_yaml
from tiedlm.config.identity import config_hash, diff_keys
from tiedlm.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
BUDGET = ["train.max_steps=5"]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads_and_validates(path):
    import yaml

    if "grid" in yaml.safe_load(path.read_text()):  # a sweep grid: every run of it must load
        from tiedlm.experiment.sweep import expand, load_grid

        configs = [run.cfg for run in expand(load_grid(path))]
        assert len(configs) > 1 and len({(c.seed, str(c)) for c in configs}) == len(configs)
    elif "init_from" in (yaml.safe_load(path.read_text()).get("model") or {}):
        configs = [_pretrained_start(path)]
    else:
        configs = [load_config(path)]
    for cfg in configs:
        assert cfg.name
        assert (cfg.train.max_steps is None) != (cfg.train.max_tokens is None)


def _pretrained_start(path):
    """A shipped config that starts from a checkpoint it tells how to make: without it, one line
    naming the folder; with a tiny checkpoint of the same kind (a GPT-2 folder and its tokenizer),
    it loads and takes the checkpoint's size."""
    import tempfile

    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel

    named = yaml_model(path)["init_from"]
    if not Path(named).exists():
        with pytest.raises(ConfigError, match="no such model folder"):
            load_config(path)
    folder = Path(tempfile.mkdtemp()) / "ckpt"
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1, n_head=2)).save_pretrained(folder)
    tok = Tokenizer(models.WordLevel({"<|endoftext|>": 0, "<unk>": 1}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(folder / "tokenizer.json"))
    cfg = load_config(path, [f"model.init_from={folder}"])
    assert cfg.model.arch == "hf" and cfg.model.n_embd == 16 and cfg.model.vocab_size == 40
    return cfg


def yaml_model(path) -> dict:
    import yaml

    return yaml.safe_load(path.read_text()).get("model") or {}


def test_precedence_defaults_base_file_set_seed(tmp_path):
    write(tmp_path / "a.yaml", "model:\n  n_embd: 64\n  n_head: 2\ntrain:\n  lr: 0.01\n  max_steps: 3\n")
    write(tmp_path / "b.yaml", "base: a.yaml\nmodel:\n  n_embd: 32\nseed: 4\n")
    cfg = load_config(tmp_path / "b.yaml", ["train.lr=2e-3"], seed=9)
    assert cfg.model.n_embd == 32  # file over base
    assert cfg.model.n_head == 2  # from base
    assert cfg.model.n_layer == 4  # dataclass default
    assert cfg.train.lr == 0.002  # --set over file; '2e-3' (a string to PyYAML) read as a number
    assert cfg.seed == 9  # --seed last


def test_base_chain_relative_to_including_file_and_list(tmp_path):
    (tmp_path / "sub").mkdir()
    write(tmp_path / "root.yaml", "train:\n  max_steps: 7\n")
    write(tmp_path / "sub" / "mid.yaml", "base: ../root.yaml\nmodel:\n  n_layer: 3\n")
    write(tmp_path / "other.yaml", "model:\n  n_layer: 5\n  dropout: 0.1\n")
    write(tmp_path / "top.yaml", "base: [sub/mid.yaml, other.yaml]\nname: top\n")
    cfg = load_config(tmp_path / "top.yaml")
    assert (cfg.train.max_steps, cfg.model.n_layer, cfg.model.dropout, cfg.name) == (7, 5, 0.1, "top")


def test_base_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.yaml", "base: b.yaml\n")
    write(tmp_path / "b.yaml", "base: a.yaml\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(tmp_path / "a.yaml")


@pytest.mark.parametrize("overrides, message", [
    (["model.n_emb=3"], "unknown key model.n_emb — did you mean model.n_embd?"),
    (["data.n_embd=3"], "did you mean model.n_embd?"),
    (["model.n_embd=abc"], "model.n_embd must be an integer, got 'abc'"),
    (["model.hf_overrides=3"], "model.hf_overrides must be a mapping such as {rms_norm_eps: 1.0e-6} or null, got 3"),
    (["eval.also=[1]"], "eval.also must be a mapping such as {path: builtin:shakespeare} or null, got [1]"),
    (["model.tie_embeddings=yes please"], "model.tie_embeddings must be true/false"),
    (["model.n_embd=100", "model.n_head=3"], "divisible by model.n_head"),
    (["train.lr=-0.1"], "train.lr must be positive"),
    (["model.untie_at=1.5"], "fraction in (0, 1)"),
    (["model.dropout=1"], "model.dropout must be in [0, 1)"),
    (["data.validation_fraction=1.2"], "data.validation_fraction"),
    (["tokenizer.kind=wordpiece"], "tokenizer.kind must be one of"),
    (["train.device=gpu"], "train.device must be"),
    (["model.embed_scale=2"], "embed_scale must be 1 or sqrt_d"),
    (["model.n_embd"], "must look like key=value"),
])
def test_bad_values_are_one_line_errors(overrides, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, BUDGET + overrides)
    assert message in str(info.value)
    assert "\n" not in str(info.value)
    assert info.value.exit_code == 2


def test_budget_is_required_and_exclusive():
    with pytest.raises(ConfigError, match="training budget"):
        load_config(None, [])
    cfg = load_config(None, ["train.max_steps=3", "train.max_tokens=1000"])  # the later one wins
    assert (cfg.train.max_steps, cfg.train.max_tokens) == (None, 1000)


def test_unknown_key_in_file_and_wrong_section(tmp_path):
    write(tmp_path / "c.yaml", "model:\n  n_layers: 2\ntrain:\n  max_steps: 1\n")
    with pytest.raises(ConfigError, match="unknown key model.n_layers — did you mean model.n_layer"):
        load_config(tmp_path / "c.yaml")


def test_yaml_syntax_error_names_line(tmp_path):
    write(tmp_path / "bad.yaml", "model:\n  n_layer: [1,\n")
    with pytest.raises(ConfigError, match="bad.yaml line"):
        load_config(tmp_path / "bad.yaml")


def test_missing_file():
    with pytest.raises(ConfigError, match="does not exist"):
        load_config("/nonexistent/x.yaml")


def test_hash_ignores_seed_and_name_but_not_tying():
    a = load_config(None, BUDGET, seed=1)
    b = load_config(None, BUDGET + ["name=other"], seed=2)
    c = load_config(None, BUDGET + ["model.tie_embeddings=false"], seed=1)
    assert config_hash(a) == config_hash(b)
    assert config_hash(a) != config_hash(c)
    assert diff_keys(to_dict(a), to_dict(c)) == ["model.tie_embeddings"]


def test_yaml_round_trip():
    import yaml

    from tiedlm.config import from_dict

    cfg = load_config(None, BUDGET + ["model.untie_at=0.5", "eval.buckets=[0.2, 0.6]"])
    again = from_dict(yaml.safe_load(to_yaml(cfg)))
    assert again == cfg


def test_all_keys_lists_nested_fields():
    assert "data.synthetic.zipf" in ALL_KEYS and "model.tie_embeddings" in ALL_KEYS


def test_a_later_budget_replaces_an_earlier_one(tmp_path):
    write(tmp_path / "a.yaml", "train:\n  max_tokens: 1000\n")
    write(tmp_path / "b.yaml", "base: a.yaml\ntrain:\n  max_steps: 5\n")
    cfg = load_config(tmp_path / "b.yaml")
    assert (cfg.train.max_steps, cfg.train.max_tokens) == (5, None)
    cfg = load_config(tmp_path / "a.yaml", ["train.max_steps=7"])
    assert (cfg.train.max_steps, cfg.train.max_tokens) == (7, None)
    # both in one layer is still an error
    write(tmp_path / "c.yaml", "train:\n  max_tokens: 1000\n  max_steps: 5\n")
    with pytest.raises(ConfigError, match="only one training budget"):
        load_config(tmp_path / "c.yaml")


@pytest.mark.parametrize("key", ["data.split_seed", "data.synthetic.seed"])
def test_negative_seeds_are_refused(key):
    with pytest.raises(ConfigError, match="must not be negative"):
        load_config(None, BUDGET + [f"{key}=-1"])
    with pytest.raises(ConfigError, match="seed must not be negative"):
        load_config(None, BUDGET, seed=-3)


def test_operational_keys_do_not_change_the_variant():
    base = load_config(None, BUDGET)
    for override in ("train.threads=8", "train.checkpoint_every=7", "train.log_every=3", "train.eval_every=9",
                     "eval.batch_size=2", "train.compile=true", "train.eval_tokens=100"):
        assert config_hash(load_config(None, BUDGET + [override])) == config_hash(base), override
    for override in ("train.device=cpu", "train.dtype=bf16", "train.lr=0.01", "eval.stride=64"):
        assert config_hash(load_config(None, BUDGET + [override])) != config_hash(base), override


@pytest.mark.parametrize("name", ["run", "tiny-s0", "base-n_embd=256-tied-s0", "lr=1e+3", "a.b_c", "9", "x" * 200])
def test_check_run_name_accepts_plain_names(name):
    from tiedlm.config.checks import check_run_name

    check_run_name(name)


@pytest.mark.parametrize("name, problem", [
    ("", "is empty"), (".", "starts with '.'"), ("..", "starts with '.'"), (".git", "starts with '.'"),
    ("-rf", "starts with '-'"), ("a/b", "holds '/'"), ("a\\b", "holds '\\\\'"), ("a\nb", "holds '\\n'"),
    (" a", "holds ' '"), ("a\0", "holds '\\x00'"), ("café", "holds 'é'"), ("a,b;c", "holds ',;'"),
    ("x" * 201, "is 201 characters long"),
])
def test_check_run_name_refuses_what_the_rule_excludes(name, problem):
    from tiedlm.config.checks import RUN_NAME_RULE, check_run_name

    with pytest.raises(ConfigError) as info:
        check_run_name(name, "--name")
    message = str(info.value)
    assert problem in message and message.endswith(RUN_NAME_RULE) and "\n" not in message
    assert info.value.exit_code == 2 and len(message) < 400  # a long name is shortened in the message


@pytest.mark.parametrize("override, message", [
    ("train.weight_decay=inf", "train.weight_decay must be a finite number, got inf"),
    ("train.grad_clip=nan", "train.grad_clip must be a finite number, got nan"),
    ("data.synthetic.zipf=.inf", "data.synthetic.zipf must be a finite number"),
    ("train.min_lr=nan", "train.min_lr must be a finite number"),
    ("eval.buckets=[0.1, .nan]", "eval.buckets must hold finite numbers, got [0.1, nan]"),
    ("data.synthetic.train_tokens=1e15", "data.synthetic.train_tokens must be at most 100,000,000"),
    ("data.synthetic.vocab_size=1e7", "data.synthetic.vocab_size must be at most 1,000,000"),
    ("data.synthetic.n_classes=2000", "data.synthetic.n_classes must be at most 1,024"),
    ("data.synthetic.zipf=1000", "data.synthetic.zipf must be at most 10"),
    ("train.threads=100000", "train.threads must be at most 1,024"),
    ("tokenizer.pad_to_multiple=1e15", "tokenizer.pad_to_multiple must be at most 4,096"),
    ("seed=1e30", "seed must be below 2**64"),
    ("train.lr=20", "train.lr x train.weight_decay must be below 1"),
    ("data.data_files=5", "data.data_files must be a path, a glob, a list of them or a mapping"),
    ("data.data_files={train: [a.txt, 3]}", "data.data_files must be a path"),
])
def test_absurd_and_non_finite_values_are_refused(override, message):
    with pytest.raises(ConfigError) as info:
        load_config(None, BUDGET + [override])
    assert message in str(info.value) and "\n" not in str(info.value)


def test_valid_edge_values_still_load():
    cfg = load_config(None, BUDGET + ["train.lr=20", "train.weight_decay=0", "data.path=text",
                                      "data.data_files={train: [a.txt]}",
                                      "data.synthetic.train_tokens=1e8", "seed=18446744073709551615"])
    assert cfg.train.lr == 20 and cfg.seed == 2**64 - 1


def test_duplicate_keys_name_both_lines(tmp_path):
    write(tmp_path / "d.yaml", "train:\n  max_steps: 5\nmodel:\n  n_layer: 2\n  dropout: 0.1\n  n_layer: 3\n")
    with pytest.raises(ConfigError, match=r"d.yaml: duplicate key 'n_layer' \(lines 4 and 6\) — keep one of them"):
        load_config(tmp_path / "d.yaml")
    with pytest.raises(ConfigError, match=r"--set data.data_files: duplicate key 'train' \(line 1\)"):
        load_config(None, BUDGET + ["data.data_files={train: a.txt, train: b.txt}"])


def test_warmup_as_a_fraction_follows_the_budget_and_keeps_old_hashes():
    """train.warmup: a share of the steps (issue: a budget change must never break the warm-up)."""
    from tiedlm.config import budget_steps, check_warmup, warmup_steps_for
    from tiedlm.train.step import lr_at

    base = load_config(str(ROOT / "configs" / "base.yaml"), ["train.max_steps=10"])
    assert check_warmup(base, budget_steps(base), verdict=False) is not None  # 100 warm-up steps in 10
    assert "train.warmup=0.1" in check_warmup(base, budget_steps(base), verdict=False)  # the fix names it
    short = load_config(str(ROOT / "configs" / "base.yaml"), ["train.max_steps=10", "train.warmup=0.2"])
    assert check_warmup(short, budget_steps(short)) is None  # a share of any budget fits it
    assert warmup_steps_for(short.train, 10) == 2 and warmup_steps_for(short.train, 1000) == 200
    assert [round(lr_at(s, 10, short.train) / short.train.lr, 3) for s in (0, 1, 2)] == [0.5, 1.0, 1.0]
    assert warmup_steps_for(base.train, 10) == base.train.warmup_steps  # unset: the count of steps
    assert config_hash(base) == config_hash(load_config(str(ROOT / "configs" / "base.yaml"),
                                                        ["train.max_steps=10", "train.warmup=null"]))
    assert config_hash(short) != config_hash(base)
    with pytest.raises(ConfigError, match="train.warmup must be a fraction"):
        load_config(str(ROOT / "configs" / "base.yaml"), ["train.warmup=5"])
