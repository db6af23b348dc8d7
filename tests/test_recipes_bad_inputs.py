"""Bad recipes and task files (recipes/, data/tasks.py).

Every case runs the CLI in-process and asserts: exit code 2, no traceback, one ``error:`` line naming the file /
field / option / value at fault (or click's usage error naming the option), and that the folder holding the
inputs and the output is byte for byte as it was (docs/reliability.md; helpers: tests/badinputs.py)."""

from __future__ import annotations


import pytest

from badinputs import as_other_tools_write, invoke, refused


# ---------------------------------------------------------------------------------------------- recipes
RECIPE_CASES = {
    "a-list": (b"- calibration\n- ood\n", ["expected a mapping"]),
    "a-string": (b"calibration\n", ["expected a mapping"]),
    "binary": (bytes(range(256)), ["r.yaml:1", "NUL byte"]),
    "bad-yaml": (b"recipe: [calibration\n", ["not valid YAML"]),
    "no-recipe": (b"tasks: [SST-2]\n", ["'recipe:'"]),
    "unknown-recipe": (b"recipe: alchemy\n", ["unknown recipe 'alchemy'"]),
    "recipe-a-list": (b"recipe: [graft]\n", ["unknown recipe ['graft']"]),  # was an unhashable-type traceback
    "recipe-a-mapping": (b"recipe: {graft: 1}\n", ["unknown recipe {'graft': 1}"]),
    "misspelt-field": (b"recipe: calibration\nseedz: [13]\n", ["seedz", "unknown field"]),
    "seed-negative": (b"recipe: calibration\nseeds: [13, -1]\n", ["r.yaml.seeds.1", "greater than or equal to 0"]),
    "seed-too-large": (b"recipe: graft\nseed: 4294967296\n", ["r.yaml.seed", "less than or equal to 4294967295"]),
    "lr-nan": (b"recipe: calibration\nfinetune: {lr: .nan}\n", ["r.yaml.finetune.lr", "finite number"]),
    "steps-huge": (b"recipe: calibration\nlocalize: {steps: 99999999999}\n", ["r.yaml.localize.steps",
                                                                              "less than or equal to 2147483647"]),
    "k-zero": (b"recipe: wise\nk: 0\n", ["r.yaml.k", "greater than or equal to 1"]),
}


@pytest.mark.parametrize("case", list(RECIPE_CASES))
def test_bad_recipe(case, tmp_path):
    content, culprits = RECIPE_CASES[case]
    path = tmp_path / "r.yaml"
    path.write_bytes(content)
    refused(tmp_path, ["run", path, "--out", tmp_path / "out"], str(path), *culprits)


TASK_YAML = ('name: MyTask\nkind: single\nlabels: ["0", "1"]\nlabel_words: [bad, good]\n'
             'template: "*cls**sent_0*_It_was*mask*.*sep+*"\n')


@pytest.mark.parametrize("content, culprits", [
    ("name: café\n".encode("latin-1"), ["t.yaml:1", "not UTF-8 text (byte 0xe9"]),  # was: no file named
    (b"name: [MyTask\n", ["t.yaml", "not valid YAML"]),
], ids=["latin-1", "bad-yaml"])
def test_bad_task_file(content, culprits, tmp_path):
    (tmp_path / "t.yaml").write_bytes(content)
    refused(tmp_path, ["tasks", "--task-file", tmp_path / "t.yaml"], str(tmp_path / "t.yaml"), *culprits)


def test_task_file_written_by_other_tools(toy_data, tmp_path):
    (tmp_path / "t.yaml").write_bytes(as_other_tools_write(TASK_YAML, "utf-16"))
    r = invoke("tasks", "--task-file", tmp_path / "t.yaml", "--data-dir", toy_data)
    assert r.exit_code == 0 and "MyTask" in r.output, r.output
