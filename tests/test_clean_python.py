"""The clean interpreter of the tests' "without skillgraft" readers (tests/clean.py): a program runs there as
``python -c CODE ARGS…`` would — its arguments, stdout, stderr, exit code and working folder — with skillgraft never
imported; without a clean process the same program runs in a fresh interpreter, with the same result."""

from __future__ import annotations

from clean import CleanPython

PROGRAM = """
import os, sys
print(sys.argv[1:], os.getcwd(), os.environ.get("CLEAN_TEST"))
print(any(m.startswith("skillgraft") for m in sys.modules), file=sys.stderr)
sys.exit(int(sys.argv[1]))
"""


def test_a_program_runs_as_python_c_would_in_the_clean_process_and_in_a_fresh_one(clean_python, tmp_path):
    fresh = CleanPython()
    for code in (0, 3):
        got = [(r.returncode, r.stdout, r.stderr) for r in
               (python.run(PROGRAM, code, "x", cwd=tmp_path, env={"CLEAN_TEST": "yes"})
                for python in (clean_python, fresh))]
        assert got[0] == got[1] == (code, f"['{code}', 'x'] {tmp_path} yes\n", "False\n")
    assert clean_python.pid is not None  # make test forks it before collection
