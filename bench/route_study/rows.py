"""The probe (plain, class-balanced) and the centroid on every layer, fitted on 0 / 512 / 1,024 extra rows per task:
routing and share of the oracle on dev + dev2 and on test."""
import torch

from study import HIT, NORM, T, X, evaluate, feats, fit_centroid, fit_probe, lexical, run, shape_mask, train_set  # noqa: F401
HIT["dev+"] = torch.cat([HIT["dev"], HIT["dev2"]])
for n in (0, 512, 1024):
    x, y = train_set(n)
    for name, fit in (("probe-layers", fit_probe), ("probe-layers balanced", lambda a, b: fit_probe(a, b, balance=True)),
                      ("centroid-layers", fit_centroid)):
        f = fit(x.flatten(1), y)
        res = {}
        for split in ("dev+", "test"):
            lg = torch.cat([f(X("dev").flatten(1)), f(X("dev2").flatten(1))]) if split == "dev+" else f(X(split).flatten(1))
            res[split] = evaluate(shape_mask(lg, split).argmax(-1), split)
        print(f"{name:24s} +{n:<5d} dev+ {res['dev+']['routing']:.3f}/{res['dev+']['share']:.4f}  "
              f"test {res['test']['routing']:.3f}/{res['test']['share']:.4f}", flush=True)
