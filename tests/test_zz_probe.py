import json, struct, shutil
from badinputs import invoke
def _damage(path, how):
    raw = path.read_bytes(); n = struct.unpack("<Q", raw[:8])[0]; hdr = json.loads(raw[8:8+n])
    if how == "huge":
        path.write_bytes(struct.pack("<Q", 1 << 40) + raw[8:]); return
    names = [k for k in hdr if k != "__metadata__"]
    hdr[names[1]]["data_offsets"] = hdr[names[0]]["data_offsets"]
    js = json.dumps(hdr).encode(); js += b" " * ((8 - len(js) % 8) % 8)
    path.write_bytes(struct.pack("<Q", len(js)) + js + raw[8 + n:])
def test_probe(tiny_classifier, tiny_bert, toy_data, ft_run, tmp_path):
    for how in ("huge", "overlap"):
        for role in ("ft", "pre"):
            clf = tmp_path / f"clf-{how}-{role}"; shutil.copytree(tiny_classifier, clf)
            pre = tmp_path / f"pre-{how}-{role}"; shutil.copytree(tiny_bert, pre)
            _damage((clf if role == "ft" else pre) / "model.safetensors", how)
            (tmp_path / "d.jsonl").write_text("\n".join(json.dumps({"text": f"good movie {i}", "label": ["bad","good"][i%2]}) for i in range(20)))
            r = invoke("graft", "--finetuned", clf, "--pretrained", pre, "--data", tmp_path / "d.jsonl", "--out", tmp_path / f"o{how}{role}", "--budgets", "0.05", "--steps", 1, "--baselines", "")
            print("GRAFT", how, role, r.exit_code, r.output[-600:], repr(r.exception))
        run = tmp_path / f"run-{how}"; shutil.copytree(ft_run, run); _damage(run / "model" / "model.safetensors", how)
        r = invoke("evaluate", run, "--data-dir", toy_data, "--limit", 4)
        print("EVAL", how, r.exit_code, r.output[-400:], repr(r.exception))
        r = invoke("graft", "--finetuned", run, "--out", tmp_path / f"g{how}", "--data-dir", toy_data, "--budgets", "0.05", "--steps", 1, "--baselines", "")
        print("GRAFTRUN", how, r.exit_code, r.output[-400:], repr(r.exception))
    assert 0
