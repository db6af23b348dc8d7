"""skillgraft on a GPU (issue 45): fine-tuning speed and memory per precision, evaluation on GPU vs CPU, localization
step and memory (dense and lean), a skill swap beside a PEFT LoRA hot-swap, and profiles of a fine-tuning step and of
evaluation in fp32 and bf16-mixed — on one model, one card.

    python bench/gpu.py --model MODEL_DIR --data DATA_ROOT --out results.json [--device cuda] [--quick]

MODEL_DIR: Gemma-3-270M (``make gemma``'s converted folder) or a random model of its shape and vocabulary
(``../shared/gpu/make_model.py OUT 270m fp32 DATA``). Every figure is written to ``--out`` as it is measured (a
section that fails records its error and the next one runs). ``--device cpu --quick`` runs the whole script on a
tiny model here (a smoke test of the script itself; its figures mean nothing).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch

from skillgraft.data.spec import DataSpec
from skillgraft.models.placement import Placement, device_of, using
from skillgraft.models.spec import ModelSpec

RESULTS: dict = {}


def record(out: Path, key: str, value) -> None:
    RESULTS[key] = value
    out.write_text(json.dumps(RESULTS, indent=2, default=str))
    print(f"{key}: {json.dumps(value, default=str)}", flush=True)


def sync(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_reset(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def peak(device) -> float | None:
    return torch.cuda.max_memory_allocated() / 2**30 if torch.device(device).type == "cuda" else None


def weights_gib(model) -> float:
    seen, total = set(), 0
    for p in model.parameters():
        if id(p) not in seen:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total / 2**30


class StepClock:
    """A fine-tuning callback: the clock (after a device sync) at the end of step ``warm`` and of the last step, so
    a run's examples/s can be read without its first steps (kernel selection, allocator growth, per-shape setup)."""

    def __init__(self, device, warm: int, steps: int):
        self.device, self.warm, self.steps, self.marks = device, warm, steps, {}

    def on_after_optimizer_step(self, step: int) -> None:
        if step + 1 in (self.warm, self.steps):
            sync(self.device)
            self.marks[step + 1] = time.perf_counter()

    def examples_per_s(self, batch: int) -> float | None:
        if len(self.marks) < 2:
            return None
        return round((self.steps - self.warm) * batch / (self.marks[self.steps] - self.marks[self.warm]), 1)


def section(out: Path, name: str):
    def wrap(fn):
        def run(*a, **kw):
            t0 = time.perf_counter()
            try:
                fn(*a, **kw)
            except Exception as e:  # noqa: BLE001 - a bench records a failed section and goes on
                record(out, f"{name}:error", f"{type(e).__name__}: {e} | {traceback.format_exc()[-1500:]}")
            print(f"[{name}] {time.perf_counter() - t0:.1f} s", flush=True)
        return run
    return wrap


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--quick", action="store_true", help="few steps and rows (a smoke test of this script)")
    args = ap.parse_args()
    q = args.quick
    steps = 6 if q else 60
    warm = 2 if q else 10  # steps left out of the after-warm-up figure
    data = DataSpec(task="SST-2", k=64, seed=13, data_dir=args.data, test_limit=64 if q else 512).load()
    spec = ModelSpec(model=args.model, mode="causal")
    dev = Placement(device=args.device).resolve().device
    record(args.out, "device", Placement(device=args.device).resolve().describe())
    record(args.out, "torch", torch.__version__)
    from skillgraft.train import FinetuneConfig
    from skillgraft.train.run import train

    ft_holder = {}

    @section(args.out, "finetune")
    def finetune():
        for precision in ("fp32", "bf16-mixed", "bf16"):
            peak_reset(dev)
            with using(Placement(device=args.device, precision=precision)):
                scorer = spec.scorer(data.task)
                cfg = FinetuneConfig(optimizer="sgd", lr=1e-3, steps=steps, batch_size=8, eval_every=0,
                                     weight_decay=1e-4, freeze_embeddings=True)
                clock = StepClock(dev, warm, steps)
                result = train(scorer, data.train, [], cfg, k=64, progress=False, callbacks=[clock])
            sync(dev)
            record(args.out, f"finetune:{precision}", {"examples_per_s": round(result.examples_per_second, 1),
                                                       f"examples_per_s_after_{warm}": clock.examples_per_s(8),
                                                       "steps": steps, "batch": 8, "peak_gib": peak(dev),
                                                       "weights_gib": round(weights_gib(scorer), 3)})
            if precision == "fp32":
                ft_holder["ft"] = scorer
            del scorer
        # host-bound or device-bound? the same step at 4x the batch (a host-bound loop gains nearly 4x examples/s)
        peak_reset(dev)
        with using(Placement(device=args.device, precision="bf16-mixed")):
            scorer = spec.scorer(data.task)
            cfg = FinetuneConfig(optimizer="sgd", lr=1e-3, steps=steps // 2, batch_size=32, eval_every=0,
                                 weight_decay=1e-4, freeze_embeddings=True)
            clock = StepClock(dev, warm, steps // 2)
            result = train(scorer, data.train, [], cfg, k=64, progress=False, callbacks=[clock])
        sync(dev)
        record(args.out, "finetune:bf16-mixed:batch32", {"examples_per_s": round(result.examples_per_second, 1),
                                                         f"examples_per_s_after_{warm}": clock.examples_per_s(32),
                                                         "steps": steps // 2, "batch": 32, "peak_gib": peak(dev)})
        del scorer

    finetune()

    @section(args.out, "evaluate")
    def evaluate():
        from skillgraft.evaluate.predict import predict_probs

        rows = data.test
        for where, n in ((args.device, len(rows)), ("cpu", 32 if q else 128)):
            for precision in (("fp32", "bf16-mixed") if where != "cpu" else ("fp32",)):
                with using(Placement(device=where, precision=precision)):
                    scorer = spec.scorer(data.task)
                predict_probs(scorer, rows[:8], batch_size=64)  # warm-up (kernels, allocator)
                sync(device_of(scorer))
                t0 = time.perf_counter()
                predict_probs(scorer, rows[:n], batch_size=64)
                sync(device_of(scorer))
                seconds = time.perf_counter() - t0
                record(args.out, f"evaluate:{where}:{precision}", {"rows": n, "rows_per_s": round(n / seconds, 1)})
                del scorer

    evaluate()

    @section(args.out, "localize")
    def localize_sections():
        from skillgraft.graft.localizers import LocalizeConfig
        from skillgraft.graft.localizers.learned import localize

        ft = ft_holder["ft"]
        for name, extra in (("dense", {}), ("lean", {"candidates": 0.01, "gradient_checkpointing": True})):
            with using(Placement(device=args.device)):
                pre = spec.scorer(data.task)
            peak_reset(dev)
            cfg = LocalizeConfig(steps=4 if q else 20, budgets=[1e-4, 1e-3], batch_size=64, micro_batch=16,
                                 eval_every=10, **extra)
            t0 = time.perf_counter()
            result = localize(pre, ft, data.train, data.dev, cfg, progress=False)
            sync(dev)
            record(args.out, f"localize:{name}", {"step_s": result.step_seconds, "seconds": time.perf_counter() - t0,
                                                  "peak_gib": peak(dev), "weights_gib": round(weights_gib(pre), 3),
                                                  "batch": 64})
            ft_holder[f"region:{name}"] = next(iter(result.regions.values()))
            ft_holder["pre"] = pre

    localize_sections()

    @section(args.out, "swap")
    def swap():
        from skillgraft.graft import Graft
        from skillgraft.models.anatomy import graftable_names

        pre, ft = ft_holder.get("pre"), ft_holder["ft"]
        if pre is None:
            with using(Placement(device=args.device)):
                pre = spec.scorer(data.task)
        names = graftable_names(pre)
        p_pre, p_ft = dict(pre.named_parameters()), dict(ft.named_parameters())
        deltas = torch.cat([(p_ft[n].detach() - p_pre[n].detach()).abs().reshape(-1).float() for n in names])
        k = max(1, int(1e-4 * deltas.numel()))
        top = torch.topk(deltas, k).indices.cpu()
        from skillgraft.graft.region import Region

        shapes = {n: tuple(p_pre[n].shape) for n in names}
        indices, start = {}, 0
        for n in names:
            size = p_pre[n].numel()
            mine = top[(top >= start) & (top < start + size)] - start
            if mine.numel():
                indices[n] = torch.sort(mine).values
            start += size
        before = {n: p.detach().clone() for n, p in pre.named_parameters() if n in indices}

        def timed_swaps(graft, count: int) -> dict:
            """Median apply + revert over ``count`` swaps, and whether θ_pre came back bit for bit."""
            times = []
            for _ in range(count):
                sync(dev)
                t0 = time.perf_counter()
                graft.apply(pre)
                graft.revert(pre)
                sync(dev)
                times.append(time.perf_counter() - t0)
            exact = all(torch.equal(p, before[n]) for n, p in pre.named_parameters() if n in indices)
            return {"bit_exact": exact, "apply_revert_us_median": round(statistics.median(times) * 1e6, 1)}

        record(args.out, "swap:graft", {"coordinates": k,
                                        **timed_swaps(Graft.from_models(pre, ft, Region(shapes, indices)),
                                                      5 if q else 200)})
        if dev.type == "cuda":  # the opt-in CUDA-graph replay of the same writes (graft/graft.py `_capture`)
            import os

            os.environ["SKILLGRAFT_SWAP_GRAPHS"] = "1"
            graphed = Graft.from_models(pre, ft, Region(shapes, indices))
            figures = timed_swaps(graphed, 200)
            del os.environ["SKILLGRAFT_SWAP_GRAPHS"]
            sw = graphed.__dict__.get("_swap")
            record(args.out, "swap:graft_cuda_graphs", {"captured": bool(sw is not None and sw.graph is not None),
                                                        **figures})
        from peft import LoraConfig, get_peft_model
        from peft.utils.hotswap import hotswap_adapter_from_state_dict

        model = get_peft_model(pre.model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"]))
        state = {k: v.detach().clone() + 0.01 for k, v in model.state_dict().items() if "lora_" in k}
        config = model.peft_config["default"]
        times = []
        for _ in range(5 if q else 100):
            sync(dev)
            t0 = time.perf_counter()
            hotswap_adapter_from_state_dict(model, state, "default", config)
            sync(dev)
            times.append(time.perf_counter() - t0)
        record(args.out, "swap:peft_lora_hotswap", {"r": 8, "targets": "q_proj,v_proj",
                                                     "us_median": round(statistics.median(times) * 1e6, 1)})

    swap()

    @section(args.out, "profile")
    def profile():
        """Where a fine-tuning step's time goes (torch.profiler, 10 steps after 3 warm-up ones), for the record."""
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with using(Placement(device=args.device)):
            scorer = spec.scorer(data.task)
            cfg = FinetuneConfig(optimizer="sgd", lr=1e-3, steps=3, batch_size=8, eval_every=0,
                                 freeze_embeddings=True)
            train(scorer, data.train, [], cfg, k=64, progress=False)
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
            with torch_profile(activities=activities) as prof:
                train(scorer, data.train, [], cfg.replace(steps=10), k=64, progress=False)
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        table = prof.key_averages().table(sort_by=key, row_limit=25)
        args.out.with_name("gpu_profile.txt").write_text(table)
        record(args.out, "profile", {"file": "gpu_profile.txt", "sorted_by": key})

    profile()

    @section(args.out, "profile_eval")
    def profile_eval():
        """Why evaluation in bf16-mixed ran 12× slower than in fp32 on the H200 (bench/RESULTS.md, open): two batches
        of 64 test rows per precision under torch.profiler, after a warm-up on the same rows (same shapes)."""
        from torch.profiler import ProfilerActivity, profile as torch_profile

        from skillgraft.evaluate.predict import predict_probs

        rows = data.test[:128]
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
        key = "cuda_time_total" if dev.type == "cuda" else "cpu_time_total"
        tables = []
        for precision in ("fp32", "bf16-mixed"):
            with using(Placement(device=args.device, precision=precision)):
                scorer = spec.scorer(data.task)
            predict_probs(scorer, rows, batch_size=64)  # warm-up on the very shapes profiled
            sync(dev)
            t0 = time.perf_counter()
            with torch_profile(activities=activities) as prof:
                predict_probs(scorer, rows, batch_size=64)
                sync(dev)
            seconds = time.perf_counter() - t0
            tables.append(f"== {precision}: {len(rows)} rows in {seconds:.3f} s (profiled)\n"
                          + prof.key_averages().table(sort_by=key, row_limit=20))
            record(args.out, f"profile_eval:{precision}", {"rows": len(rows), "seconds": round(seconds, 4)})
            del scorer
        args.out.with_name("gpu_profile_eval.txt").write_text("\n\n".join(tables))

    profile_eval()


if __name__ == "__main__":
    sys.exit(main())
