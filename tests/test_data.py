import json

import pytest

from skillgraft.data import TASKS, get_task, load_kshot, load_split, load_task_yaml, register_task, task_from_dict
from skillgraft.errors import SkillgraftError


def test_registry_covers_lmbff_suite():
    for name in ["SST-2", "sst-5", "mr", "cr", "mpqa", "subj", "trec", "ag_news", "MNLI", "SNLI", "QNLI", "RTE",
                 "MRPC", "QQP", "imdb", "yelp_polarity"]:
        assert name in TASKS
    assert get_task("mrpc").metric == "f1" and get_task("QQP").metric == "f1"
    assert get_task("SST-2").metric == "accuracy"
    assert get_task("sst-2").label_words == ("terrible", "great")
    assert get_task("ag_news").labels == ("1", "2", "3", "4")
    assert get_task("MNLI").label_words == ("No", "Yes", "Maybe")


def test_unknown_task_lists_known():
    with pytest.raises(SkillgraftError, match="known tasks"):
        get_task("nope")


def test_register_from_yaml(tmp_path):
    f = tmp_path / "t.yaml"
    f.write_text("name: toxic\nkind: single\nlabel_words: {ok: fine, bad: awful}\n"
                 "template: '*cls**sent_0*_It_was*mask*.*sep+*'\n")
    (task,) = load_task_yaml(f)
    assert task.labels == ("ok", "bad") and task.label_words == ("fine", "awful")
    with pytest.raises(SkillgraftError, match="already registered"):
        load_task_yaml(f)
    TASKS.pop("toxic")


def test_task_validation_errors():
    with pytest.raises(SkillgraftError, match="label words"):
        task_from_dict({"name": "x", "kind": "single", "labels": ["a", "b"], "label_words": ["w"],
                        "template": "*mask*"})
    with pytest.raises(SkillgraftError, match="missing required field 'template'"):
        task_from_dict({"name": "x", "kind": "single", "labels": ["a", "b"], "label_words": ["v", "w"]})
    with pytest.raises(SkillgraftError, match="causal template"):
        register_task(task_from_dict({"name": "x2", "kind": "single", "labels": ["a", "b"], "label_words": ["v", "w"],
                                      "template": "*cls**mask*:*sent_0*"}))


def _write(root, rows, folder="SST-2", split="train"):
    (root / folder).mkdir(parents=True, exist_ok=True)
    (root / folder / f"{split}.jsonl").write_text("".join(r + "\n" for r in rows))


def test_malformed_line_names_file_and_line(tmp_path):
    _write(tmp_path, ['{"text": "a", "label": "1"}', '{"text": "b", "label": '])
    with pytest.raises(SkillgraftError, match=r"train.jsonl:2: malformed JSON"):
        load_split("SST-2", "train", tmp_path)


def test_unknown_label_lists_labels(tmp_path):
    _write(tmp_path, ['{"text": "a", "label": "positive"}'])
    with pytest.raises(SkillgraftError, match=r"train.jsonl:1: unknown label 'positive'.*\['0', '1'\]"):
        load_split("SST-2", "train", tmp_path)


def test_missing_field_and_empty_split(tmp_path):
    _write(tmp_path, ['{"label": "1"}'])
    with pytest.raises(SkillgraftError, match="field 'text' is missing"):
        load_split("SST-2", "train", tmp_path)
    _write(tmp_path, [])
    with pytest.raises(SkillgraftError, match="empty"):
        load_split("SST-2", "train", tmp_path)


def test_blank_texts_are_kept(tmp_path):
    _write(tmp_path, ['{"text": " ", "label": "1"}', '{"text": "ok", "label": "0"}'])
    ex = load_split("SST-2", "train", tmp_path)
    assert ex[0].text_a == " " and ex[0].label == 1


def test_missing_data_dir_is_clear(tmp_path):
    with pytest.raises(SkillgraftError, match="no data directory"):
        load_split("SST-2", "train", tmp_path / "nowhere")


def test_kshot_deterministic_and_disjoint(toy_data):
    a = load_kshot("SST-2", 8, 13, toy_data)
    b = load_kshot("SST-2", 8, 13, toy_data)
    c = load_kshot("SST-2", 8, 21, toy_data)
    assert a.train == b.train and a.dev == b.dev
    assert a.train != c.train
    assert [e.label for e in a.train] == [0] * 8 + [1] * 8
    assert not set(map(id, a.train)) & set(map(id, a.dev))
    assert len(a.dev) == 16 and len(a.test) == 80


def test_kshot_matches_lmbff_rule(toy_data):
    """train = first K per label, dev = next K per label, after numpy's seeded shuffle of the lines."""
    import numpy as np

    lines = load_split("SST-2", "train", toy_data)
    np.random.seed(42)
    shuffled = list(lines)
    np.random.shuffle(shuffled)
    expect = [e for lab in (0, 1) for e in [x for x in shuffled if x.label == lab][:4]]
    assert load_kshot("SST-2", 4, 42, toy_data).train == expect


def test_k_too_large_says_how_many(toy_data):
    with pytest.raises(SkillgraftError, match="has only 100"):
        load_kshot("SST-2", 101, 13, toy_data)


def test_rare_label_keeps_a_short_dev_as_lmbff(toy_data):
    """100 rows per label at K = 64: train 64 per label, dev the 36 left (LM-BFF's [K:2K] slice), and a warning."""
    with pytest.warns(UserWarning, match="fewer than 2·K=128"):
        draw = load_kshot("SST-2", 64, 13, toy_data)
    assert [sum(e.label == lab for e in draw.train) for lab in (0, 1)] == [64, 64]
    assert [sum(e.label == lab for e in draw.dev) for lab in (0, 1)] == [36, 36]
    assert not set(map(id, draw.train)) & set(map(id, draw.dev))


def test_lmbff_tsv_and_csv_layouts(tmp_path):
    orig = tmp_path / "original"
    (orig / "RTE").mkdir(parents=True)
    (orig / "RTE" / "train.tsv").write_text("index\tsentence1\tsentence2\tlabel\n0\tA cat.\tAn animal.\tentailment\n")
    (orig / "mr").mkdir(parents=True)
    (orig / "mr" / "test.csv").write_text('1,"a fine, fun film"\n0,dull\n')
    rte = load_split("RTE", "train", tmp_path)
    assert rte[0].text_a == "A cat." and rte[0].text_b == "An animal." and rte[0].label == 1
    mr = load_split("mr", "test", tmp_path)
    assert mr[0].text_a == "a fine, fun film" and mr[0].label == 1
    kdir = tmp_path / "k-shot" / "mr" / "2-13"
    kdir.mkdir(parents=True)
    for split in ("train", "dev", "test"):
        (kdir / f"{split}.csv").write_text("0,bad\n1,good\n")
    d = load_kshot("mr", 2, 13, tmp_path)
    assert [e.text_a for e in d.train] == ["bad", "good"]


def test_data_dir_env(tmp_path, monkeypatch, toy_data):
    monkeypatch.setenv("SKILLGRAFT_DATA", str(toy_data))
    assert len(load_split("SST-2", "test")) == 80


@pytest.mark.real
def test_shared_data_kshot(shared_data):
    d = load_kshot("SST-2", 16, 13, shared_data)
    assert len(d.train) == 32 and len(d.dev) == 32 and len(d.test) == 872
    cr = load_split("cr", "train", shared_data)
    assert any(not e.text_a.strip() for e in cr)  # blank rows kept
    assert json.loads((shared_data / "MRPC" / "test.jsonl").read_text().splitlines()[0])["label"] in ("0", "1")


def test_task_without_test_split_is_tested_on_the_rest_of_train(tmp_path):
    """QQP has no test split in the shared data: a draw is tested on the train rows outside its train + dev."""
    (tmp_path / "QQP").mkdir()
    rows = [{"text_a": f"question {i}?", "text_b": f"other {i}?", "label": str(i % 2)} for i in range(60)]
    (tmp_path / "QQP" / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    d = load_kshot("QQP", 8, 13, tmp_path)
    seen = {(ex.text_a, ex.text_b) for ex in d.train + d.dev}
    assert len(d.train) == len(d.dev) == 16 and len(d.test) == 60 - 32
    assert not seen & {(ex.text_a, ex.text_b) for ex in d.test}            # disjoint from the draw
    assert {ex.text_a for ex in d.test} | {t for t, _ in seen} == {r["text_a"] for r in rows}
    assert len(load_kshot("QQP", 8, 13, tmp_path, test_limit=10).test) == 10
    with pytest.raises(SkillgraftError, match="has no test split"):
        load_split("QQP", "test", tmp_path)                                 # the split itself is still absent
    (tmp_path / "MRPC").mkdir()                                             # any other task still needs its test split
    (tmp_path / "MRPC" / "train.jsonl").write_text((tmp_path / "QQP" / "train.jsonl").read_text())
    with pytest.raises(SkillgraftError, match="'MRPC' has no test split"):
        load_kshot("MRPC", 8, 13, tmp_path)


def test_dev_limit_scores_a_seeded_part_of_dev_and_leaves_old_keys_alone(toy_data):
    from skillgraft.data.spec import DataSpec
    from skillgraft.spec import stable_hash

    full = load_kshot("SST-2", 8, 13, toy_data)
    part = DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, dev_limit=5).load()
    assert len(part.dev) == 5 and all(ex in full.dev for ex in part.dev)
    assert part.train == full.train and part.test == full.test
    assert part.dev == DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, dev_limit=5).load().dev  # seeded
    assert len(DataSpec(task="SST-2", k=8, seed=13, data_dir=toy_data, dev_limit=500).load().dev) == 16
    # a draw without it keeps the key it had before the field existed: stored runs are still found
    plain = DataSpec(task="SST-2", k=8, seed=13)
    assert plain.key() == stable_hash({"task": "SST-2", "k": 8, "seed": 13, "data_dir": None, "test_limit": None})
    assert DataSpec(task="SST-2", k=8, seed=13, dev_limit=5).key() != plain.key()
    with pytest.raises(SkillgraftError, match="dev_limit"):
        DataSpec.build({"dev_limit": 0})
