"""Grafting the models and data users already have (issue 11): checkpoint pairs saved by plain transformers,
users' own data files, generative prompt→completion pairs, and exports that load with the user's own class.

Every fine-tuned checkpoint here is trained by plain torch/transformers code in the test (no skillgraft
training code), saved with ``save_pretrained``, and grafted from the CLI.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest
import torch
from tiny import build_tiny, sentence
from userland import LABELS, cli, invoke, sentiment_rows, sft_rows, train_classifier, train_sft, write_rows

from skillgraft.errors import SkillgraftError

@pytest.fixture(scope="module")
def user_data(tmp_path_factory) -> Path:
    return write_rows(tmp_path_factory.mktemp("user-data") / "reviews.jsonl", sentiment_rows())


@pytest.fixture(scope="module")
def pairs(tiny_models, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """(A, B) per architecture: A the tiny pre-trained checkpoint, B a sequence classifier fine-tuned from it."""
    root = tmp_path_factory.mktemp("pairs")
    rows = sentiment_rows()
    return {kind: (tiny_models[kind], train_classifier(tiny_models[kind], root / kind, rows))
            for kind in ("bert", "roberta", "gpt2", "llama")}


def max_diff_and_provenance(export: Path, pre, graft, inputs: list[str]) -> tuple[float, int, int]:
    """(max |export − in-memory graft| over the logits, coordinates equal to neither A nor B, coordinates of B)."""
    import transformers as tf

    cls = tf.AutoModelForSequenceClassification if pre.mode == "classifier" else tf.AutoModelForCausalLM
    loaded = cls.from_pretrained(export).eval()
    tok = tf.AutoTokenizer.from_pretrained(export)
    enc = tok(inputs, return_tensors="pt", padding=True)
    with torch.no_grad():
        a_state = {k: v.clone() for k, v in pre.model.state_dict().items()}
        with graft.applied(pre):
            want = pre.model(**enc).logits
            grafted = {k: v.clone() for k, v in pre.model.state_dict().items()}
        got = loaded(**enc).logits
    exp_state = loaded.state_dict()
    neither, from_b = 0, 0
    for name, value in exp_state.items():
        if name not in a_state:
            continue
        a, b = a_state[name], grafted[name]
        neither += int(((value != a) & (value != b)).sum())
        from_b += int(((value == b) & (value != a)).sum())
    return float((got - want).abs().max()), neither, from_b


def graft_and_export(tmp_path: Path, a: Path, b: Path, data_args: list, budget: str = "1e-2") -> tuple[Path, Path]:
    out = tmp_path / "report"
    cli("graft", "--pretrained", a, "--finetuned", b, *data_args, "--budgets", budget, "--steps", 3,
        "--baselines", "", "--no-lottery-zero", "--out", out)
    graft_dir = next((out / "grafts").iterdir())
    export = tmp_path / "export"
    cli("apply", graft_dir, "--export", export)
    return out, export


@pytest.mark.parametrize("kind", ["bert", "roberta", "gpt2", "llama"])
def test_classifier_pair_grafted_from_the_cli_exports_to_the_users_class(kind, pairs, user_data, tmp_path):
    from skillgraft.data.tasks import Task
    from skillgraft.graft import Graft
    from skillgraft.models import build_scorer

    a, b = pairs[kind]
    out, export = graft_and_export(tmp_path, a, b, ["--data", user_data])
    report = (out / "report.md").read_text()
    assert "head only" in report and "config.id2label" in report
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["carried_parameters"] > 0  # the classification head travels whole
    graft = Graft.from_pretrained(next((out / "grafts").iterdir()))
    assert any("classifier" in n or "score" in n for n in graft.carried)
    assert json.loads((export / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}
    pre = build_scorer(str(a), Task("reviews", "single", LABELS, LABELS, "*cls**sent_0**mask*"), "classifier")
    diff, neither, from_b = max_diff_and_provenance(export, pre, graft, [r["text"] for r in sentiment_rows(8, 5)])
    assert diff <= 1e-6
    assert neither == 0                                     # every coordinate is A's or B's
    head = sum(t.numel() for t in graft.carried.values())
    assert 0 < from_b <= graft.size + head                  # B's values only on γ and the carried head


def test_generative_pair_graft_reports_completion_loss_and_exports_a_causal_lm(tiny_models, tmp_path):
    from skillgraft.graft import Graft
    from skillgraft.models import build_scorer
    from skillgraft.pipeline.opening import task_from_record

    rows = sft_rows()
    data = write_rows(tmp_path / "sft.jsonl", rows)
    a = tiny_models["llama"]
    b = train_sft(a, tmp_path / "sft-model", rows)
    out, export = graft_and_export(tmp_path, a, b, ["--data", data, "--prompt-field", "prompt",
                                                    "--completion-field", "completion"], budget="5e-2")
    report = (out / "report.md").read_text()
    assert "completion loss" in report and "share of FT's loss drop" in report and "exact match" in report
    rows_m = {r["model"]: r for r in json.loads((out / "metrics.json").read_text())["rows"]}
    ft, pre_row = rows_m["fine-tuned"], rows_m["pre-trained"]
    assert ft["loss"] < pre_row["loss"] and ft["loss_recovered"] == pytest.approx(1.0)
    assert ft["exact_match"] > pre_row["exact_match"]
    graft = Graft.from_pretrained(next((out / "grafts").iterdir()))
    assert graft.metadata.mode == "generative" and not graft.carried
    pre = build_scorer(str(a), task_from_record(graft.metadata.task_spec), "generative")
    diff, neither, from_b = max_diff_and_provenance(export, pre, graft, [r["prompt"] for r in rows[:6]])
    assert diff <= 1e-6 and neither == 0 and 0 < from_b <= graft.size


def test_generative_loss_is_completion_tokens_only(tiny_models):
    """The loss ignores the prompt: changing the prompt's own tokens' targets does not enter it."""
    from skillgraft.data.loading import Example
    from skillgraft.data.user import GenerativeTask
    from skillgraft.models import build_scorer

    scorer = build_scorer(str(tiny_models["llama"]), GenerativeTask.make("g"), "generative")
    batch = scorer.collate([Example("the movie was", 0, " great"), Example("a film", 0, " bad plot")])
    completion = [scorer.completion_ids(" great"), scorer.completion_ids(" bad plot")]
    assert [int((t != -100).sum()) for t in batch["target_ids"]] == [len(c) for c in completion]
    with torch.no_grad():
        logits = scorer.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        manual = []
        for i, c in enumerate(completion):
            n = int(batch["attention_mask"][i].sum())
            logp = torch.log_softmax(logits[i, n - len(c) - 1:n - 1].float(), -1)
            manual.append(-logp[torch.arange(len(c)), torch.tensor(c)].mean())
        assert float(scorer.loss(batch)) == pytest.approx(float(torch.stack(manual).mean()), abs=1e-5)


def test_bad_pairs_each_get_their_error_before_any_work(tiny_models, pairs, user_data, tmp_path):
    a, b = pairs["bert"]
    common = ["--data", user_data, "--steps", 1, "--budgets", "1e-2", "--out", tmp_path / "never"]
    out = cli("graft", "--pretrained", tiny_models["roberta"], "--finetuned", b, *common, code=2)
    assert "different architectures" in out
    shallow = build_tiny("bert", tmp_path / "shallow", layers=1)
    assert "different shapes" in cli("graft", "--pretrained", shallow, "--finetuned", b, *common, code=2)
    retok = tmp_path / "retok"
    shutil.copytree(a, retok)
    import transformers as tf
    tok = tf.AutoTokenizer.from_pretrained(retok)
    tok.add_tokens(["zzqx"])
    tok.save_pretrained(retok)
    assert "different tokenizers" in cli("graft", "--pretrained", retok, "--finetuned", b, *common, code=2)
    # A lacking a body tensor B has (not a head or a pooler)
    from safetensors.torch import load_file, save_file
    lacking = tmp_path / "lacking"
    shutil.copytree(a, lacking)
    state = load_file(str(lacking / "model.safetensors"))
    drop = next(k for k in state if "layer.1.attention.self.query.weight" in k)
    save_file({k: v for k, v in state.items() if k != drop}, str(lacking / "model.safetensors"),
              metadata={"format": "pt"})
    out = cli("graft", "--pretrained", lacking, "--finetuned", b, *common, code=2)
    assert "lacks 1 tensor(s) of the model body" in out and "query" in out
    out = cli("graft", "--pretrained", tmp_path / "no-such-model", "--finetuned", b, *common, code=2)
    assert "no such folder" in out and "--pretrained" in out
    assert "give --pretrained" in cli("graft", "--finetuned", b, *common[:-2], code=2)
    assert not (tmp_path / "never").exists()


def test_causal_pair_lacking_tensors_is_refused(tiny_models, tmp_path):
    from safetensors.torch import load_file, save_file

    from skillgraft.data.spec import UserDataSpec
    from skillgraft.pipeline.opening import from_pair

    a = tiny_models["llama"]
    lacking = tmp_path / "lacking"
    shutil.copytree(a, lacking)
    state = load_file(str(lacking / "model.safetensors"))
    save_file({k: v for k, v in state.items() if "layers.1.mlp.up_proj" not in k}, str(lacking / "model.safetensors"),
              metadata={"format": "pt"})
    data = UserDataSpec.build({"data": write_rows(tmp_path / "sft.jsonl", sft_rows(40)), "prompt_field": "prompt",
                               "completion_field": "completion"})
    with pytest.raises(SkillgraftError, match="lacks 1 tensor"):
        from_pair(str(lacking), str(a), data)


def test_user_data_files_labels_and_kshot(tmp_path):
    from skillgraft.data.spec import UserDataSpec

    rows = [{"sentence": r["text"], "other": r["text"][::-1], "y": r["label"]} for r in sentiment_rows(60)]
    tsv = write_rows(tmp_path / "pairs.tsv", rows)
    spec = UserDataSpec.build({"data": tsv, "text_field": "sentence", "text_pair_field": "other", "label_field": "y"})
    d = spec.load()
    assert d.task.kind == "pair" and d.task.labels == LABELS and "inferred" in d.labels_note
    assert len(d.train) + len(d.test) == 60 and len(d.test) == 12  # a seeded 20% held out
    assert d.train[0].text_b is not None
    assert spec.replace(labels=["pos", "neg"]).load().task.labels == ("pos", "neg")     # declared: logit order
    kshot = spec.replace(k=5).load()
    assert sorted(ex.label for ex in kshot.train) == [0] * 5 + [1] * 5
    assert kshot.test == d.test                                                         # k-shot never moves test
    assert spec.load(("LABEL_0", "LABEL_1")).task.labels == LABELS                      # generic id2label: sorted
    ints = write_rows(tmp_path / "ints.csv", [{"text": r["text"], "label": LABELS.index(r["label"])}
                                              for r in sentiment_rows(20)])
    assert UserDataSpec.build({"data": ints}).load(("bad", "good")).task.labels == ("bad", "good")  # indices
    with pytest.raises(SkillgraftError, match="neither the fine-tuned model's labels"):
        spec.load(("negative", "positive"))
    with pytest.raises(SkillgraftError, match=r"pairs\.tsv:\d+: field 'text' is missing"):
        UserDataSpec.build({"data": tsv}).load()
    with pytest.raises(SkillgraftError, match="not among the declared labels"):
        spec.replace(labels=["pos", "meh"]).load()
    (tmp_path / "empty").mkdir()
    with pytest.raises(SkillgraftError, match="empty: not a Hugging Face dataset folder"):
        UserDataSpec.build({"data": tmp_path / "empty"}).load()
    with pytest.raises(SkillgraftError, match="data file not found: .*missing.jsonl"):
        UserDataSpec.build({"data": tmp_path / "missing.jsonl"}).load()
    with pytest.raises(SkillgraftError, match="--data-split 'x'.*is a file with no splits"):
        spec.replace(data_split="x").load()
    with pytest.raises(SkillgraftError, match="needs both --prompt-field and --completion-field"):
        UserDataSpec.build({"data": tsv, "prompt_field": "sentence"})


# ---------------------------------------------------------------------------------------------- datasets
def _dataset_dict(n_train: int = 60, n_eval: int = 20):
    import datasets

    ints = lambda rows: [{"sentence": r["text"], "label": LABELS.index(r["label"])} for r in rows]  # noqa: E731
    return datasets.DatasetDict({"train": datasets.Dataset.from_list(ints(sentiment_rows(n_train, 0))),
                                 "validation": datasets.Dataset.from_list(ints(sentiment_rows(n_eval, 1))),
                                 "test": datasets.Dataset.from_list(ints(sentiment_rows(n_eval + 2, 2)))})


def test_hugging_face_dataset_folders_and_splits(tmp_path):
    """A save_to_disk folder (train / validation / test) and a folder of data files in a hub repository's layout."""
    from skillgraft.data.spec import UserDataSpec

    _dataset_dict().save_to_disk(str(tmp_path / "saved"))
    spec = UserDataSpec.build({"data": tmp_path / "saved", "text_field": "sentence"})
    d = spec.load(("neg", "pos"))
    assert (len(d.train), len(d.test)) == (60, 20)                        # learned on train, evaluated on validation
    assert d.source_note.endswith("evaluated on " + str(tmp_path / "saved") + " [validation]")
    assert d.train[0].text_a == sentiment_rows(1, 0)[0]["text"] and d.train[0].label == 0
    assert any(f.suffix == ".arrow" for f in d.files)                     # the store keys cover the data's content
    assert len(spec.replace(eval_split="test").load(("neg", "pos")).test) == 22
    assert len(spec.replace(k=4).load(("neg", "pos")).train) == 8         # k-shot per label
    with pytest.raises(SkillgraftError,
                       match=r"no split 'dev' \(--eval-split\); it has \['test', 'train', 'validation'\]"):
        spec.replace(eval_split="dev").load()
    with pytest.raises(SkillgraftError, match="is the split the graft is learned on"):
        spec.replace(eval_split="train").load()
    with pytest.raises(SkillgraftError, match="save_to_disk, which has no configurations"):
        spec.replace(data_config="sst2").load()
    # one split saved alone: a seeded 20% is held out
    _dataset_dict()["train"].save_to_disk(str(tmp_path / "one"))
    one = UserDataSpec.build({"data": tmp_path / "one", "text_field": "sentence"}).load(("neg", "pos"))
    assert (len(one.train), len(one.test)) == (48, 12) and "held out" in one.source_note
    # data files in a hub repository's layout: train.jsonl + test.jsonl → splits train / test
    (tmp_path / "repo").mkdir()
    write_rows(tmp_path / "repo" / "train.jsonl", sentiment_rows(40, 0))
    write_rows(tmp_path / "repo" / "test.jsonl", sentiment_rows(10, 3))
    repo = UserDataSpec.build({"data": tmp_path / "repo"}).load()
    assert (len(repo.train), len(repo.test)) == (40, 10) and repo.task.labels == LABELS
    assert sorted(f.name for f in repo.files) == ["test.jsonl", "train.jsonl"]


def test_hub_dataset_name_goes_to_load_dataset(tmp_path, monkeypatch):
    """A name that is no local path is a Hub dataset: ``datasets.load_dataset(name, config)`` (stubbed: no Hub here)."""
    import datasets

    from skillgraft.data.spec import UserDataSpec

    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda name, config=None, **kw: calls.append((name, config))
                        or _dataset_dict())
    d = UserDataSpec.build({"data": "someone/reviews", "data_config": "default", "text_field": "sentence",
                            "data_split": "validation", "eval_split": "test"}).load(("neg", "pos"))
    assert calls == [("someone/reviews", "default")]
    assert (len(d.train), len(d.test)) == (20, 22) and d.task.name == "reviews"


def test_unreachable_hub_dataset_is_one_clear_line(pairs, tmp_path, monkeypatch):
    """Offline (as here), a Hub name fails before any weights load, naming the dataset; no traceback."""
    import datasets
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as a reader without a Hub connection (both libraries read it once)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    a, b = pairs["bert"]
    r = invoke("graft", "--pretrained", a, "--finetuned", b, "--data", "nobody/no-such-dataset", "--out",
               tmp_path / "unused")
    assert r.exit_code == 2, r.output
    assert r.output.startswith("error: nobody/no-such-dataset: no such file or folder, and loading it as a "
                               "Hugging Face Hub dataset failed: "), r.output
    assert len(r.output.strip().splitlines()) == 1 and not (tmp_path / "unused").exists()


def test_graft_a_saved_dataset_from_the_cli(pairs, tmp_path):
    _dataset_dict().save_to_disk(str(tmp_path / "saved"))
    a, b = pairs["bert"]
    out = tmp_path / "report"
    printed = cli("graft", "--pretrained", a, "--finetuned", b, "--data", tmp_path / "saved", "--text-field",
                  "sentence", "--budgets", "1e-2", "--steps", 2, "--baselines", "", "--no-lottery-zero", "--out", out)
    assert "[validation]" in printed and "indices into the fine-tuned model's config.id2label" in printed
    assert "evaluated on" in (out / "report.md").read_text()
    assert json.loads((out / "metrics.json").read_text())["rows"][0]["n"] == 20
    assert "(n=22)" in cli("evaluate", b, "--data", tmp_path / "saved", "--text-field", "sentence",
                           "--eval-split", "test")


def test_evaluate_any_hf_checkpoint_with_user_data(pairs, user_data, toy_data):
    _, b = pairs["gpt2"]
    out = cli("evaluate", b, "--data", user_data)
    assert "(n=120)" in out and "config.id2label" in out
    assert "SST-2 test (n=80)" in cli("evaluate", b, "--task", "SST-2", "--data-dir", toy_data)  # a registered task
    out = cli("evaluate", b, "--data", user_data, "--labels", "pos,neg", "--limit", 10)
    assert "(n=10)" in out and "declared" in out
    assert "needs data" in cli("evaluate", b, code=2)


def test_head_mode_export_is_marked_incomplete(tiny_bert, tmp_path):
    from skillgraft.graft import Graft, Region
    from skillgraft.export import export_hf
    from skillgraft.models import build_scorer
    from skillgraft.pipeline.variants import universe

    pre = build_scorer(str(tiny_bert), "SST-2", "head")
    ft = build_scorer(str(tiny_bert), "SST-2", "head", head_seed=3)
    graft = Graft.from_models(pre, ft, Region.empty(universe(pre)), {"task": "SST-2", "mode": "head"})
    s = export_hf(graft, pre, tmp_path / "exp")
    assert not s["complete"] and "incomplete" in (tmp_path / "exp" / "README.md").read_text().lower()
    assert "skillgraft_incomplete" in json.loads((tmp_path / "exp" / "config.json").read_text())


@pytest.mark.real
@pytest.mark.slow  # the same path on tiny classifiers trained by plain transformers runs in make test (`pairs`)
def test_real_minilm_sst2_classifier_fine_tuned_by_plain_transformers(shared_data, tmp_path):
    """MiniLM fine-tuned on 32 SST-2 examples by plain transformers code, grafted from the CLI, exported and
    reloaded with AutoModelForSequenceClassification."""
    import transformers as tf

    from skillgraft.models.loading import bundled_minilm_path

    a = bundled_minilm_path()
    lines = (shared_data / "SST-2" / "train.jsonl").read_text().splitlines()
    rng = random.Random(0)
    rows = [json.loads(x) for x in rng.sample(lines, 32)]
    data = write_rows(tmp_path / "sst2-train.jsonl", rows)
    test_lines = (shared_data / "SST-2" / "test.jsonl").read_text().splitlines()
    test = write_rows(tmp_path / "sst2-test.jsonl", [json.loads(x) for x in random.Random(1).sample(test_lines, 32)])
    tok = tf.AutoTokenizer.from_pretrained(a)
    torch.manual_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(a, num_labels=2)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-5)
    model.train()
    for step in range(4):
        batch = rows[step * 8:step * 8 + 8]
        enc = tok([r["text"] for r in batch], return_tensors="pt", padding=True, truncation=True, max_length=48)
        model(**enc, labels=torch.tensor([int(r["label"]) for r in batch])).loss.backward()
        opt.step()
        opt.zero_grad()
    b = tmp_path / "minilm-sst2"
    model.save_pretrained(b)
    tok.save_pretrained(b)
    out = tmp_path / "report"
    cli("graft", "--pretrained", a, "--finetuned", b, "--data", data, "--eval-data", test, "--budgets", "1e-3",
        "--steps", 1, "--baselines", "", "--no-lottery-zero", "--out", out)
    export = tmp_path / "export"
    cli("apply", next((out / "grafts").iterdir()), "--export", export)
    reloaded = tf.AutoModelForSequenceClassification.from_pretrained(export).eval()
    enc = tok(["a gorgeous, witty film", "dull and lifeless"], return_tensors="pt", padding=True)
    with torch.no_grad():
        assert reloaded(**enc).logits.shape == (2, 2)
    metrics = json.loads((out / "metrics.json").read_text())
    assert {r["kind"] for r in metrics["rows"]} >= {"pre", "head-only", "ft", "graft"}


def test_classifier_graft_as_a_peft_adapter_keeps_its_head(pairs, user_data, tmp_path):
    """--to peft: the classifier's own head goes whole into modules_to_save (task_type SEQ_CLS), so
    PeftModel.from_pretrained on AutoModelForSequenceClassification(A) computes the graft, head included."""
    import transformers as tf
    from peft import PeftModel

    from skillgraft.graft import Graft
    from skillgraft.export import graft_task
    from skillgraft.models import build_scorer

    a, b = pairs["roberta"]
    out = tmp_path / "report"
    cli("graft", "--pretrained", a, "--finetuned", b, "--data", user_data, "--budgets", "1e-2", "--steps", 2,
        "--baselines", "", "--no-lottery-zero", "--out", out)
    graft_dir = next((out / "grafts").iterdir())
    cli("export", graft_dir, "--to", "peft", "--out", tmp_path / "adapter")
    cfg = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert cfg["task_type"] == "SEQ_CLS" and any(m.startswith("classifier") for m in cfg["modules_to_save"])
    assert not (tmp_path / "adapter" / "skillgraft_head.safetensors").exists()
    g = Graft.from_pretrained(graft_dir)
    pre = build_scorer(str(a), graft_task(g), "classifier")
    tok = tf.AutoTokenizer.from_pretrained(a)
    enc = tok([r["text"] for r in sentiment_rows(6, 9)], return_tensors="pt", padding=True)
    base = tf.AutoModelForSequenceClassification.from_pretrained(a, num_labels=2)
    with torch.no_grad(), g.applied(pre):
        want = pre.model(**enc).logits
    with torch.no_grad():
        got = PeftModel.from_pretrained(base, tmp_path / "adapter").eval()(**enc).logits
    assert float((got - want).abs().max()) <= 1e-6


def test_registered_task_split_from_a_dataset(tmp_path):
    """``load_hf_split``: a registered task's examples from a Hugging Face dataset (here a save_to_disk folder)."""
    from skillgraft.data import load_hf_split

    _dataset_dict().save_to_disk(str(tmp_path / "saved"))
    examples = load_hf_split("SST-2", "validation", str(tmp_path / "saved"))
    assert len(examples) == 20 and examples[1].label == 1 and examples[0].text_a == sentiment_rows(1, 1)[0]["text"]
    with pytest.raises(SkillgraftError, match=r"no split 'dev' \(split\)"):
        load_hf_split("SST-2", "dev", str(tmp_path / "saved"))


def train_label_words(base: Path, out: Path, *, masked: bool, steps: int = 20, lr: float = 3e-3) -> Path:
    """Plain transformers prompt fine-tuning: the label word at the mask (masked LM) or next (causal LM)."""
    import transformers as tf

    tok = tf.AutoTokenizer.from_pretrained(base)
    tok.pad_token = tok.pad_token or tok.eos_token
    torch.manual_seed(2)
    model = (tf.AutoModelForMaskedLM if masked else tf.AutoModelForCausalLM).from_pretrained(base)
    words = [tok.encode(w, add_special_tokens=False)[0] for w in (" terrible", " great")] if not masked else \
        [tok.convert_tokens_to_ids(w) for w in ("terrible", "great")]
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    rng = random.Random(0)
    model.train()
    for _ in range(steps):
        ys = [rng.randint(0, 1) for _ in range(8)]
        texts = [sentence(rng, y) + (f" It was {tok.mask_token} ." if masked else " It was") for y in ys]
        enc = tok(texts, return_tensors="pt", padding=True)
        logits = model(**enc).logits
        if masked:
            at = enc["input_ids"] == tok.mask_token_id
            picked = logits[at]
        else:
            last = enc["attention_mask"].sum(1) - 1
            picked = logits[torch.arange(len(ys)), last]
        loss = torch.nn.functional.cross_entropy(picked[:, words], torch.tensor(ys))
        loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize("kind, masked, cls", [("bert", True, "AutoModelForMaskedLM"),
                                               ("llama", False, "AutoModelForCausalLM")])
def test_label_word_pairs_masked_lm_prompt_and_causal(kind, masked, cls, tiny_models, toy_data, tmp_path):
    """A masked LM (prompt mode: template + label words at the mask) and a causal LM with label words (causal
    mode), fine-tuned by plain transformers, grafted on a registered task from the CLI, exported to their class."""
    import transformers as tf
    from safetensors.torch import load_file

    from skillgraft.graft import Graft

    a = tiny_models[kind]
    b = train_label_words(a, tmp_path / "ft", masked=masked)
    out = tmp_path / "report"
    cli("graft", "--pretrained", a, "--finetuned", b, "--task", "SST-2", "--data-dir", toy_data, "--k", 16,
        "--budgets", "5e-2", "--steps", 2, "--baselines", "", "--no-lottery-zero", "--out", out)
    graft_dir = next((out / "grafts").iterdir())
    graft = Graft.from_pretrained(graft_dir)
    assert graft.metadata.mode == ("prompt" if masked else "causal") and not graft.carried
    rows = {r["model"]: r for r in json.loads((out / "metrics.json").read_text())["rows"]}
    assert {"pre-trained", "fine-tuned"} <= set(rows) and rows["fine-tuned"]["n"] == 80
    cli("apply", graft_dir, "--export", tmp_path / "export", "--data-dir", toy_data)  # scored on the toy test split
    loaded = getattr(tf, cls).from_pretrained(tmp_path / "export")
    a_state = {k: v for k, v in load_file(str(a / "model.safetensors")).items()}
    b_state = load_file(str(b / "model.safetensors"))
    changed = 0
    for name, value in loaded.state_dict().items():
        if name in a_state:
            neither = (value != a_state[name]) & (value != b_state[name])
            assert not neither.any(), name                      # every coordinate is A's or B's
            changed += int((value != a_state[name]).sum())
    assert 0 < changed <= graft.size
