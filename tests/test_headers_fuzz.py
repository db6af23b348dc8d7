"""GGUF and safetensors headers are walked and bounded by skillgraft before a reader sees the file (issue 77;
models/headers.py, docs/reliability.md §19): the public crash shapes and a short hypothesis run each end in a load or
one line, never a traceback or a hang. bench/fuzz_headers.py runs the same targets longer."""

from __future__ import annotations

import pytest
from fuzzing import (BOMB_49, damaged, gguf_crash_shapes, gguf_target, safetensors_crash_shapes, safetensors_target,
                     small_gguf, small_safetensors)
from hypothesis import HealthCheck, given, settings

from skillgraft.errors import SkillgraftError

FAST = settings(max_examples=60, deadline=5000, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def valid(tmp_path_factory):
    root = tmp_path_factory.mktemp("valid")
    return {"gguf": small_gguf(root / "v.gguf"), "safetensors": small_safetensors()}


def _ends_in_a_load_or_one_line(target, path) -> None:
    try:
        target(path)
    except SkillgraftError as e:
        assert "\n" not in str(e) and str(path) in str(e)


def test_the_49_byte_gguf_is_one_line_and_the_reader_never_sees_it(tmp_path, monkeypatch):
    """Its metadata array claims 2⁶³ elements: gguf-py 0.19.0 looped over it, allocating, until killed."""
    import gguf

    from userland import invoke
    from badinputs import one_line

    def reader(*_a, **_k):
        raise AssertionError("gguf-py's reader was given the file")

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    path = tmp_path / "bomb.gguf"
    path.write_bytes(BOMB_49)
    (tmp_path / "r.jsonl").write_text("".join(f'{{"text": "film {i}", "label": "{i % 2}"}}\n' for i in range(8)))
    assert len(BOMB_49) == 49
    line = one_line(invoke("evaluate", path, "--data", tmp_path / "r.jsonl"), path,
                    "claims 9,223,372,036,854,775,808 elements")
    assert "GGUFReader" not in line


def test_the_49_byte_gguf_is_refused_by_the_program_before_torch_is_imported(tmp_path):
    """Done when: "the crafted 49-byte GGUF ends in one line within a second" — the line comes before torch's import
    (seconds on a cold cache), counted exactly: the program's own process never imports torch for it."""
    import subprocess
    import sys

    path = tmp_path / "bomb.gguf"
    path.write_bytes(BOMB_49)
    code = ("import sys\nsys.argv = ['skillgraft', 'evaluate', sys.argv[1], '--task', 'SST-2']\n"
            "from skillgraft.cli.entry import main\ntry:\n    main()\nexcept SystemExit as e:\n"
            "    print('exit', e.code, 'torch' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == "exit 2 False", (done.stdout, done.stderr)
    assert done.stderr.count("\n") == 1 and "claims 9,223,372,036,854,775,808 elements" in done.stderr


def test_a_gguf_walked_once_is_not_walked_again_until_it_changes(tmp_path, monkeypatch):
    """The command line walks a verb's GGUF input before torch's import and the loader walks it again: the second
    walk is the first's result; a file replaced in place (another size or mtime) is walked afresh, and refused."""
    import skillgraft.models.headers as headers

    path = tmp_path / "v.gguf"
    small_gguf(path)
    walks = []
    real = headers.walk_gguf
    monkeypatch.setattr(headers, "walk_gguf", lambda data: walks.append(1) or real(data))
    first = headers.check_gguf(path)
    assert headers.check_gguf(path) == first and len(walks) == 1
    path.write_bytes(BOMB_49)
    with pytest.raises(SkillgraftError, match="claims 9,223,372,036,854,775,808 elements"):
        headers.check_gguf(path)
    assert len(walks) == 2


def test_gguf_crash_shapes_are_one_line_before_the_reader(valid, tmp_path, monkeypatch):
    import gguf

    def reader(*_a, **_k):
        raise AssertionError("gguf-py's reader was given a damaged file")

    monkeypatch.setattr(gguf, "GGUFReader", reader)
    for name, data in gguf_crash_shapes(valid["gguf"]).items():
        path = tmp_path / f"{name}.gguf"
        path.write_bytes(data)
        with pytest.raises(SkillgraftError) as caught:
            gguf_target(path)
        assert str(path) in str(caught.value) and "\n" not in str(caught.value), name


def test_safetensors_crash_shapes_are_one_line_before_safetensors(valid, tmp_path, monkeypatch):
    import safetensors

    def opened(*_a, **_k):
        raise AssertionError("safetensors was given a damaged file")

    monkeypatch.setattr(safetensors, "safe_open", opened)
    for name, data in safetensors_crash_shapes(valid["safetensors"]).items():
        folder = tmp_path / name
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(data)
        with pytest.raises(SkillgraftError, match="not a readable safetensors file") as caught:
            safetensors_target(folder)
        assert "\n" not in str(caught.value), name


def test_the_valid_files_load(valid, tmp_path):
    (tmp_path / "v.gguf").write_bytes(valid["gguf"])
    gguf_target(tmp_path / "v.gguf")
    (tmp_path / "model.safetensors").write_bytes(valid["safetensors"])
    safetensors_target(tmp_path)


@pytest.mark.parametrize("kind", ["gguf", "safetensors"])
def test_fuzzed_headers_end_in_a_load_or_one_line(kind, valid, tmp_path):
    path = tmp_path / ("f.gguf" if kind == "gguf" else "model.safetensors")
    target = gguf_target if kind == "gguf" else safetensors_target

    @FAST
    @given(damaged(valid[kind]))
    def run(data):
        path.write_bytes(data)
        _ends_in_a_load_or_one_line(target, path if kind == "gguf" else tmp_path)

    run()
