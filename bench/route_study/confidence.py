"""A second stage on the skills' own outputs: each row's skill by the router's log-posterior (temperature tau) plus
beta × the candidate skill's confidence on the row (its top probability, rescaled by its label count: 0 = uniform,
1 = certain), from the dev / dev2 rows scored under every skill (scores.json); share of the oracle on dev + dev2."""
import torch
from study import X, evaluate, feats, fit_probe, scores, shape_mask, tasks, train_set
x, y = train_set(0); f = fit_probe(x.flatten(1), y)
def conf_dev(split):
    C = []
    for t in tasks:
        n = len(scores[split][t][tasks[0]])
        for i in range(n):
            row = []
            for k in tasks:
                p = list(scores[split][t][k][i][1].values()); L = len(p)
                row.append((max(p) - 1 / L) / (1 - 1 / L))
            C.append(row)
    return torch.tensor(C)
for split in ("dev", "dev2"):
    assert len(conf_dev(split)) == len(feats[split]["y"])
Cd = torch.cat([conf_dev("dev"), conf_dev("dev2")])
lg = torch.cat([shape_mask(f(X(s).flatten(1)), s) for s in ("dev", "dev2")])
lp = torch.log_softmax(lg, -1)
for beta in (0, 0.25, 0.5, 1, 2, 4, 8):
    pred = (lp + beta * Cd).argmax(-1)
    r = evaluate(pred, "dev+")
    print(f"beta {beta}: dev+ routing {r['routing']:.3f} share {r['share']:.4f}", r["per_task"])
best = (0, None)
for tau in (2, 5, 10, 20, 50):
    lpt = torch.log_softmax(lg / tau, -1)
    for beta in (0.25, 0.5, 1, 2, 4):
        r = evaluate((lpt + beta * Cd).argmax(-1), "dev+")
        if r["share"] > best[0]: best = (r["share"], (tau, beta, r["routing"], r["per_task"]))
print("best", best)
print("margin of the router's top choice (log-prob gap top1-top2), quantiles:",
      torch.quantile((lambda s: s[:, 0] - s[:, 1])(torch.log_softmax(lg, -1).sort(-1, descending=True).values), torch.tensor([.1, .25, .5])).tolist())
