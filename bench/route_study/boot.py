import torch

from study import HIT, NORM, T, X, evaluate, feats, fit_centroid, fit_probe, lexical, run, shape_mask, train_set  # noqa: F401
x, y = train_set(0); f = fit_probe(x.flatten(1), y)
pred = shape_mask(f(X("test").flatten(1)), "test").argmax(-1)
yt = feats["test"]["y"]; H = HIT["test"].float()
got = H[torch.arange(len(yt)), pred]; own = H[torch.arange(len(yt)), yt]
g = torch.Generator().manual_seed(0); shares = []
idx_by = [torch.nonzero(yt == i).flatten() for i in range(T)]
for _ in range(2000):
    acc, ora = [], []
    for i in range(T):
        s = idx_by[i][torch.randint(len(idx_by[i]), (len(idx_by[i]),), generator=g)]
        acc.append(got[s].mean() / NORM["test"][i]); ora.append(own[s].mean() / NORM["test"][i])
    shares.append(float(torch.stack(acc).mean() / torch.stack(ora).mean()))
shares = torch.tensor(shares)
print("point", evaluate(pred, "test")["share"], "boot 2.5/50/97.5 %", shares.quantile(torch.tensor([.025, .5, .975])).tolist(),
      "P(share>=0.99)", float((shares >= 0.99).float().mean()))
print("rows lost vs oracle:", int(own.sum() - got.sum()), "of", len(yt))
