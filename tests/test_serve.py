"""Issue 78: ``skillgraft serve ROUTED_DIR`` — an OpenAI-compatible endpoint, tested with the real ``openai`` client
against a live server on a free loopback port (tiny models): models listed, mixed skills routed per prompt, concurrent
requests each answered by its own skill, a bad request each of 400 / 404 / 413 in JSON, classifier skills on the
scoring route, SIGTERM draining the request in flight and ending the process with exit 0."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from processes import start_main
from routing import CAUSAL_SKILLS, skill_rows, write_routed_folder

openai = pytest.importorskip("openai")

def _with_router(folder):
    from skillgraft.graft.routed import RoutedSkills, attach_router
    from skillgraft.graft.router import fit_router

    attach_router(folder, fit_router(RoutedSkills.from_pretrained(folder), skill_rows(40, 0), skill_rows(16, 1)))
    return folder


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    """`skillgraft serve` in a child process on a free port (its address read from its ready line: stdout), forked
    from this worker (processes.start_main: the real entry point, no interpreter start); stopped by SIGTERM at the
    end, which must drain the request in flight and exit 0."""
    root = tmp_path_factory.mktemp("serve")
    folder = _with_router(write_routed_folder(tiny_models["llama"], root / "routed", "causal", CAUSAL_SKILLS,
                                              count=2000, scale=1.0))
    out = root / "stdout.txt"
    proc = start_main(["serve", folder, "--port", "0", "--device", "cpu", "--max-body-bytes", "4096", "--max-rows", 16],
                      root / "stderr.txt", {"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}, stdout_file=out)
    deadline = time.monotonic() + 180
    url = None
    while url is None:
        url = next((w.rstrip("/") for w in out.read_text().split() if w.startswith("http://")), None) \
            if out.is_file() else None
        if proc.ended() or time.monotonic() > deadline:
            proc.kill()
            raise AssertionError(f"no server: {(root / 'stderr.txt').read_text()[-2000:]}")
        time.sleep(0.05)
    try:
        yield url, proc, out
    finally:
        proc.kill()


def _client(url):
    return openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=120)


def test_models_are_the_skills_auto_and_base_with_their_digests(server):
    url, _, _ = server
    models = _client(url).models.list().data
    assert [m.id for m in models] == ["sentiment", "topic", "auto", "base"]
    digests = {m.id: m.model_extra.get("graft_digest") for m in models}
    assert all(len(digests[s]) == 16 for s in ("sentiment", "topic")) and digests["sentiment"] != digests["topic"]
    # auto names the tasks whose dev rows its router sends elsewhere (≥ 10 %): none here, their words differ
    auto = next(m for m in models if m.id == "auto").model_extra
    assert auto["name_the_skill_for"] == [] and "name_the_skill_for" not in models[0].model_extra


def test_mixed_prompts_routed_each_answered_by_its_skill(server):
    url, _, _ = server
    client = _client(url)
    rows = skill_rows(2, 9)
    prompts = [rows["sentiment"][0], rows["topic"][0], rows["sentiment"][1], rows["topic"][1]]
    r = client.completions.create(model="auto", prompt=prompts, max_tokens=5, temperature=0)
    skills = [c.model_extra["skill"] for c in r.choices]
    assert skills == ["sentiment", "topic", "sentiment", "topic"] and r.model_extra["skill"] == "mixed"
    assert all(0.5 <= c.model_extra["route_confidence"] <= 1 for c in r.choices)
    for name in ("sentiment", "topic"):  # the same rows sent to the named skill: the same text, the same graft
        mine = [c for c in r.choices if c.model_extra["skill"] == name]
        alone = client.completions.create(model=name, prompt=[prompts[c.index] for c in mine], max_tokens=5)
        assert [c.text for c in alone.choices] == [c.text for c in mine]
        assert alone.model_extra["skill"] == name and alone.model_extra["graft_digest"] == \
            mine[0].model_extra["graft_digest"]
    assert r.usage.completion_tokens <= 20 and r.usage.prompt_tokens > 0
    chat = client.chat.completions.create(model="topic", messages=[{"role": "user", "content": prompts[1]}],
                                          max_tokens=4)
    assert isinstance(chat.choices[0].message.content, str) and chat.model_extra["skill"] == "topic"


def test_concurrent_requests_of_several_skills_each_get_their_own_skills_answer(server):
    url, _, _ = server
    client = _client(url)
    rows = skill_rows(3, 4)
    jobs = [(m, p) for m in ("sentiment", "topic", "base") for p in rows["sentiment"] + rows["topic"]]
    want = {job: client.completions.create(model=job[0], prompt=job[1], max_tokens=6).choices[0].text
            for job in jobs}
    assert any(want[("sentiment", p)] != want[("topic", p)] for _, p in jobs)  # the skills answer differently
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda job: (job, client.completions.create(model=job[0], prompt=job[1], max_tokens=6)),
                            jobs * 2))
    assert all(r.choices[0].text == want[job] and r.model_extra["skill"] == job[0] for job, r in got)


def test_bad_requests_get_json_errors_with_the_status_a_client_expects(server):
    url, _, _ = server
    client = _client(url)
    with pytest.raises(openai.NotFoundError) as e:
        client.completions.create(model="no-such-skill", prompt="x", max_tokens=2)
    assert e.value.status_code == 404 and "the models are sentiment, topic, auto, base" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="topic", prompt="x", max_tokens=-3)
    assert e.value.status_code == 400 and "max_tokens" in str(e.value)
    with pytest.raises(openai.APIStatusError) as e:
        client.completions.create(model="topic", prompt="x" * 5000, max_tokens=2)
    assert e.value.status_code == 413 and "--max-body-bytes" in str(e.value)
    for body in (b'{"model": "topic", "prompt": ', b"[1, 2]", b'{"model": "topic"}'):  # not JSON / no object / no prompt
        req = urllib.request.Request(f"{url}/completions", data=body, headers={"content-type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=30)
        text = e.value.read().decode()
        assert e.value.code == 400 and set(json.loads(text)) == {"error"} and "Traceback" not in text
    with pytest.raises(openai.BadRequestError, match="/v1/classify|generative"):  # no scoring route on LMs
        client.post("/classify", body={"model": "topic", "input": "x"}, cast_to=object)


def test_sigterm_lets_the_request_in_flight_finish_then_exits_0(server):
    url, proc, out = server
    client = _client(url)
    prompts = skill_rows(8, 11)["topic"]
    done: dict = {}

    def long_request():
        try:
            done["r"] = client.completions.create(model="topic", prompt=prompts, max_tokens=60)
        except Exception as e:  # noqa: BLE001 - recorded for the assertion below
            done["e"] = e

    t = threading.Thread(target=long_request)
    t.start()
    time.sleep(0.5)  # the request is being generated
    os.kill(proc.pid, signal.SIGTERM)
    t.join(120)
    assert "e" not in done, done.get("e")
    assert len(done["r"].choices) == 8
    assert proc.wait() == 0
    assert "stopped by SIGTERM" in out.read_text(), out.read_text()
    with pytest.raises(openai.APIConnectionError):  # gone: no new connections
        client.models.list()


def test_classifier_skills_on_the_scoring_route(tiny_models, tmp_path):
    """The scoring route on a live in-process server (the app + uvicorn on a bound loopback socket)."""
    import uvicorn

    from skillgraft.graft.routed import RoutedSkills
    from skillgraft.verbs.serve import ServeSpec, bind
    from skillgraft.verbs.serve_app import build_app

    skills = RoutedSkills.from_pretrained(_with_router(write_routed_folder(tiny_models["bert"], tmp_path / "r")))
    app, state = build_app(skills, ServeSpec(port=0))
    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        while not server.started:
            time.sleep(0.05)
        client = _client(f"http://127.0.0.1:{sock.getsockname()[1]}/v1")
        rows = skill_rows(2, 2)
        texts = [rows["sentiment"][0], rows["topic"][0]]
        r = client.post("/classify", body={"model": "auto", "input": texts}, cast_to=object)
        assert [d["skill"] for d in r["data"]] == ["sentiment", "topic"]
        want = [skills.score([t], skill=d["skill"])[0] for t, d in zip(texts, r["data"])]
        assert [d["label"] for d in r["data"]] == [w.label for w in want]
        assert all(set(d["probabilities"]) == set(skills.labels[d["skill"]]) for d in r["data"])
        assert r["data"][1]["graft_digest"] == skills.digests["topic"]
        with pytest.raises(openai.BadRequestError, match="classify"):  # no completions on classifiers
            client.completions.create(model="topic", prompt="x", max_tokens=2)
        assert state.requests == 1
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def test_a_missing_folder_or_a_port_in_use_is_one_line_before_the_model_loads(tmp_path):
    import socket

    from badinputs import one_line
    from typer.testing import CliRunner

    from skillgraft.cli import app

    one_line(CliRunner().invoke(app, ["serve", str(tmp_path / "nothing")]), "no such folder")
    (tmp_path / "routed").mkdir()
    (tmp_path / "routed" / "routed.json").write_text('{"format": "skillgraft-routed", "base": "base", '
                                                     '"tasks": {"a": {"path": "../../etc"}}}')
    one_line(CliRunner().invoke(app, ["serve", str(tmp_path / "routed")]), "tasks.a.path")
    (tmp_path / "routed" / "routed.json").write_text('{"format": "skillgraft-routed", "base": "base", '
                                                     '"tasks": {"a": {"path": "skills/a"}}}')
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        r = CliRunner().invoke(app, ["serve", str(tmp_path / "routed"), "--port", str(taken.getsockname()[1])])
    one_line(r, "cannot listen on 127.0.0.1:")
