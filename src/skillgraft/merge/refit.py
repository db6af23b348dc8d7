"""Head alignment (``skillgraft merge --refit-heads N``): each task's head refitted on the merged body.

A merged body keeps good features, but a task's fine-tuned head was trained on its own body's features, not the
merged one's; a few labelled rows realign it (Kong et al., 2024). For task t with merged body B and head (W₀, b₀):

    features   h_i = the head's input on row i (the pooled output feeding the last linear layer), B fixed
    refit      (W, b) = argmin_W,b  1/N Σ_i CE(W h_i + b, y_i) + (α/2) ‖W − W₀‖²   (L-BFGS from (W₀, b₀))

on N labelled rows per task drawn (seeded) from the task's *training* rows — never its test rows, and apart from
the dev rows the grids are chosen on. Only the last linear layer of the head changes; the body and every other
tensor are as the merge left them (:func:`refitted` swaps the refitted layer in for a block and restores it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

from skillgraft.lazy import np
from skillgraft.lazy import no_grad, torch

from skillgraft.errors import SkillgraftError
from skillgraft.graft.merge import swapped
from skillgraft.models.anatomy import carried_names
from skillgraft.models.freezing import evaluating

L2 = 1e-2          # α: pull toward the fine-tuned head (a few rows must not undo it)
MAX_ITER = 100     # L-BFGS iterations


def head_layer(scorer) -> tuple[str, torch.nn.Linear]:
    """The last linear layer of the task head (``model.<name>``: a carried tensor of the classifier)."""
    carried = set(carried_names(scorer))
    found = [(n, m) for n, m in scorer.model.named_modules()
             if isinstance(m, torch.nn.Linear) and f"model.{n}.weight" in carried]
    if not found:
        raise SkillgraftError("--refit-heads needs classifier checkpoints (a task head of their own); these "
                              "models score through the LM head, which every task shares")
    return found[-1]


def refit_rows(train: list, n: int, seed: int = 0) -> list:
    """``n`` rows of ``train`` (a seeded sample; all of them when there are fewer)."""
    order = np.random.RandomState(seed).permutation(len(train))[:n]
    return [train[i] for i in sorted(order.tolist())]


@no_grad
def head_inputs(scorer, layer: torch.nn.Linear, rows: list, batch_size: int = 64) -> torch.Tensor:
    """The head layer's input on each row, ``[len(rows), in_features]`` (the scorer in eval mode)."""
    got: list[torch.Tensor] = []
    hook = layer.register_forward_hook(lambda mod, args, out: got.append(args[0].detach().float().cpu()))
    try:
        with evaluating(scorer):
            for start in range(0, len(rows), batch_size):
                batch = scorer.collate(rows[start:start + batch_size])
                scorer(**{k: v.to(scorer.device) for k, v in batch.items()})
    finally:
        hook.remove()
    return torch.cat(got)


def fit_head(x: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor, *, l2: float = L2,
             max_iter: int = MAX_ITER) -> dict[str, torch.Tensor]:
    """Multinomial logistic regression on features ``x`` from (w0, b0), pulled toward w0 (module doc)."""
    w0, b0 = w0.detach().float().cpu(), b0.detach().float().cpu()
    w, b = w0.clone().requires_grad_(True), b0.clone().requires_grad_(True)
    opt = torch.optim.LBFGS([w, b], lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(x @ w.T + b, y) + 0.5 * l2 * (w - w0).pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    return {"weight": w.detach(), "bias": b.detach()}


def refit_head(scorer, rows: list) -> dict[str, torch.Tensor]:
    """The head layer of ``scorer`` (as it is now: the merged body in) refitted on ``rows``."""
    _, layer = head_layer(scorer)
    x = head_inputs(scorer, layer, rows)
    y = torch.tensor([ex.label for ex in rows], dtype=torch.long)
    return fit_head(x, y, layer.weight, layer.bias if layer.bias is not None else torch.zeros(layer.out_features))


def refitted(use: Callable, rows_of: Callable[[str], list]) -> Callable:
    """``use`` (task → a context yielding the scorer of a merged model) with each task's head layer refitted on
    ``rows_of(task)`` (once per task; swapped in for the block, restored bit-exactly after)."""
    heads: dict[str, dict[str, torch.Tensor]] = {}

    @contextlib.contextmanager
    def use_refit(name):
        with use(name) as scorer:
            _, layer = head_layer(scorer)
            if name not in heads:
                heads[name] = refit_head(scorer, rows_of(name))
            state = heads[name] if layer.bias is not None else {"weight": heads[name]["weight"]}
            with swapped(layer, state):
                yield scorer
    use_refit.heads = heads
    return use_refit
