import torch

from study import HIT, NORM, T, X, evaluate, feats, fit_centroid, fit_probe, lexical, run, shape_mask, train_set  # noqa: F401
def report(name, lg_of):
    res = {}
    for split in ("dev", "dev2", "test"):
        lg = shape_mask(lg_of(split), split)
        res[split] = evaluate(lg.argmax(-1), split) if split in HIT else {"routing": float((lg.argmax(-1) == feats[split]["y"]).float().mean()), "share": float("nan")}
    print(f"{name:40s} dev {res['dev']['routing']:.3f}/{res['dev']['share']:.4f}  dev2 {res['dev2']['routing']:.3f}/{res['dev2']['share']:.4f}  test {res['test']['routing']:.3f}/{res['test']['share']:.4f}", flush=True)
_, probe = run("probe-layers +0", fit_probe, 0)
for n in (0, 1024):
    for an, ng in (("char_wb", (2, 4)), ("word", (1, 2))):
        lex = lexical(n, an, ng)
        report(f"lexical {an}{ng} +{n}", lex)
        for w in (0.5, 1.0, 2.0):
            report(f"  probe + {w}·lexical", lambda s: torch.log_softmax(probe(X(s).flatten(1)), -1) + w * torch.log_softmax(lex(s), -1))
