import torch

from study import HIT, NORM, T, X, evaluate, feats, fit_centroid, fit_probe, lexical, run, shape_mask, train_set  # noqa: F401
HIT["dev+"] = torch.cat([HIT["dev"], HIT["dev2"]])
def report(name, lg_of):
    res = {}
    for split in ("dev+", "test"):
        lg = torch.cat([lg_of("dev"), lg_of("dev2")]) if split == "dev+" else lg_of(split)
        res[split] = evaluate(shape_mask(lg, split).argmax(-1), split)
    print(f"{name:44s} dev+ {res['dev+']['routing']:.3f}/{res['dev+']['share']:.4f}  test {res['test']['routing']:.3f}/{res['test']['share']:.4f}  dev+ {res['dev+']['per_task']} test {res['test']['per_task']}", flush=True)
    return res
RUNS = {}
for n in (0, 512, 1024):
    x, y = train_set(n)
    f = fit_probe(x.flatten(1), y)
    RUNS[n] = f
    report(f"probe-layers +{n}", lambda s: f(X(s).flatten(1)))
for n in (0, 1024):
    lex = lexical(n, "char_wb", (2, 4))
    lc = {s: lex(s) for s in ("dev", "dev2", "test")}
    for pn in (0, 1024):
        pr = {s: torch.log_softmax(RUNS[pn](X(s).flatten(1)), -1) for s in ("dev", "dev2", "test")}
        for w in (0.5, 1.0, 2.0):
            report(f"probe+{pn} + {w}·char-lexical+{n}", lambda s: pr[s] + w * torch.log_softmax(lc[s], -1))
