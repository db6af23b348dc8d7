"""Routers fitted offline on cached pooled states; dev: dev+dev2 rows scored under every skill; test: cross-test200."""
import json
import os
import sys

import torch
import torch.nn.functional as F

from common import OUT, STUDY, TASKS as tasks

torch.set_num_threads(1)
root = str(OUT)
T = len(tasks)
feats = torch.load(STUDY + "/feats.pt")
scores = json.load(open(STUDY + "/scores.json")) if os.path.exists(STUDY + "/scores.json") else None
hit = json.load(open(f"{root}/cross-test200.json"))
m = json.load(open(f"{root}/merge.json"))
ft = next(r for r in m["rows"] if r["method"] == "fine-tuned")
pairs = torch.tensor([t == "QNLI" for t in tasks])

def X(s):
    return feats[s]["x"].float()

def hits(split):
    """[rows, skills] bool: the row's label right under each skill; ft normalizer per task."""
    if split == "test":
        H = torch.tensor([[hit[t][k][i] for k in tasks] for t in tasks for i in range(len(hit[t][t]))])
        return H
    H = []
    for t in tasks:
        sc = scores[split][t]
        labs = [l for tt, l in zip([tasks[i] for i in feats[split]["y"]], feats[split]["labels"]) if tt == t]
        for i, lab in enumerate(labs):
            H.append([sc[k][i][0] == lab for k in tasks])
    return torch.tensor(H)

HIT = {s: hits(s) for s in (("dev", "dev2", "test") if scores else ("test",))}
NORM = {"test": torch.tensor([ft[f"{t}:test"] for t in tasks]), "dev": torch.tensor([ft[f"{t}:dev"] for t in tasks])}

def evaluate(pred, split):
    """routing acc, share of oracle (per-task mean of acc / ft, ÷ the oracle's)."""
    y = feats[split]["y"] if split != "dev+" else torch.cat([feats["dev"]["y"], feats["dev2"]["y"]])
    H = HIT[split] if split != "dev+" else torch.cat([HIT["dev"], HIT["dev2"]])
    got = H[torch.arange(len(y)), pred].float()
    own = H[torch.arange(len(y)), y].float()
    acc = torch.stack([got[y == i].mean() for i in range(T)])
    ora = torch.stack([own[y == i].mean() for i in range(T)])
    norm = NORM["test"] if split == "test" else ora.clamp_min(1e-9)  # dev: ÷ own skill (share of oracle per task)
    return {"routing": float((pred == y).float().mean()), "share": float((acc / norm).mean() / (ora / norm).mean()),
            "per_task": [round(float(a / o), 3) for a, o in zip(acc, ora)]}

def shape_mask(logits, split):
    y = feats[split]["y"] if split != "dev+" else torch.cat([feats["dev"]["y"], feats["dev2"]["y"]])
    rowpair = pairs[y]
    allowed = rowpair[:, None] == pairs[None, :]
    return logits.masked_fill(~allowed, -1e9)

def fit_probe(x, y, l2=1e-3, balance=False):
    mean, std = x.mean(0), x.std(0).clamp_min(1e-6)
    z = (x - mean) / std
    w = torch.zeros(T, x.shape[1], requires_grad=True); b = torch.zeros(T, requires_grad=True)
    cw = None
    if balance:
        cnt = torch.bincount(y, minlength=T).float(); cw = cnt.sum() / cnt / T
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")
    def closure():
        opt.zero_grad()
        loss = F.cross_entropy(z @ w.T + b, y, weight=cw) + l2 * (w * w).sum() / 2
        loss.backward(); return loss
    opt.step(closure)
    w, b = w.detach(), b.detach()
    return lambda x2: ((x2 - mean) / std) @ w.T + b

def fit_centroid(x, y):
    z = F.normalize(x, dim=-1)
    c = F.normalize(torch.stack([z[y == t].mean(0) for t in range(T)]), dim=-1)
    return lambda x2: F.normalize(x2, dim=-1) @ c.T * 50

def train_set(n_extra, base="train"):
    x, y = X(base), feats[base]["y"]
    if n_extra:
        xe, ye = X("extra"), feats["extra"]["y"]
        keep = torch.cat([torch.nonzero(ye == i).flatten()[:n_extra] for i in range(T)])
        x, y = torch.cat([x, xe[keep]]), torch.cat([y, ye[keep]])
    return x, y

def layers(x, which):
    if which == "all":
        return x.flatten(1)
    if which == "last":
        return x[:, -1]
    return x[:, which].flatten(1)

def run(name, fit, n_extra, which="all"):
    x, y = train_set(n_extra)
    f = fit(layers(x, which), y)
    res = {}
    for split in ("dev", "dev2", "test"):
        lg = shape_mask(f(layers(X(split), which)), split)
        if split in HIT:
            res[split] = evaluate(lg.argmax(-1), split)
        else:
            res[split] = {"routing": float((lg.argmax(-1) == feats[split]["y"]).float().mean()), "share": float("nan")}
    print(f"{name:40s} dev {res['dev']['routing']:.3f}/{res['dev']['share']:.4f}  dev2 {res['dev2']['routing']:.3f}/"
          f"{res['dev2']['share']:.4f}  test {res['test']['routing']:.3f}/{res['test']['share']:.4f}", flush=True)
    return res, f

def lexical(n_extra, analyzer="char_wb", ngram=(2, 4), C=1.0):
    from sklearn.feature_extraction.text import HashingVectorizer
    from sklearn.linear_model import LogisticRegression
    import numpy as np
    texts = json.load(open(STUDY + "/texts.json"))
    hv = HashingVectorizer(analyzer=analyzer, ngram_range=ngram, n_features=2**18, alternate_sign=False, norm="l2")
    ytr = feats["train"]["y"].numpy(); tx = list(texts["train"])
    if n_extra:
        ye = feats["extra"]["y"].numpy()
        idx = [i for c in range(T) for i in np.nonzero(ye == c)[0][:n_extra]]
        tx += [texts["extra"][i] for i in idx]; ytr = np.concatenate([ytr, ye[idx]])
    clf = LogisticRegression(C=C, max_iter=2000).fit(hv.transform(tx), ytr)
    return lambda split: torch.tensor(clf.decision_function(hv.transform(texts[split])), dtype=torch.float32)


if __name__ == "__main__":
    for n in [int(a) for a in sys.argv[1:]] or [0]:
        run(f"probe-layers +{n}", fit_probe, n)
        run(f"probe-layers balanced +{n}", lambda x, y: fit_probe(x, y, balance=True), n)
        run(f"centroid-layers +{n}", fit_centroid, n)
