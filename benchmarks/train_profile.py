"""Where a training step's time goes: torch.profiler over a few steps after warm-up, grouped.

    make bench-train PRESET=llama8b PROFILE=1   # -> results/perf/train/profile.{json,txt}

`StepProfiler` watches `train_drafter` as its observer (`drafter.observer`, rank 0 only).

Every op the profiler saw is put under the innermost `specbuild::<label>` range around it: the
trainer and objective open some (`data`, `optimizer`, `teacher_full_vocab`, `teacher_draft`,
`unroll`), and while profiling, forward hooks open one per drafter module (`fc`, `layer`,
`attention`, `proj`, `mlp`, `lm_head`; `loss` for the objective's own ops). A backward op
belongs to the forward op that made its autograd node (the profiler's sequence number), so
backward time lands where its forward ran. Labels sum into GROUPS. Time is device kernel time
on CUDA and op time on the calling thread on CPU; the wall time of the profiled steps that no
op covers (the device idle, waiting for the host; Python between ops) is "data loading / host"
as well. So the groups sum to 100% of the wall time unless ops overlap (several CUDA streams,
DDP's all-reduce: profile one GPU). The batch loader's own thread (`prefetch`) overlaps the
step and is left out of the groups.
"""

from __future__ import annotations

import gzip
import logging
import os
import time
from pathlib import Path

import torch
from torch import nn
from torch.autograd import DeviceType
from torch.autograd.profiler import record_function
from torch.profiler import ProfilerActivity, profile

from specbuild.drafter.flops import device_name
from specbuild.drafter.observer import Observer, TrainRun
from specbuild.infra.io import atomic_path, write_json

__all__ = ["GROUPS", "StepProfiler", "format_report", "group_times"]

log = logging.getLogger("specbuild")

PREFIX = "specbuild::"
BACKWARD = "autograd::engine::evaluate_function: "
WARMUP_STEPS = 3  # CUDA context, allocator growth and kernel choice settle in the first steps
PROFILE_STEPS = 3
ATTENTION, HEAD, DENSE = "attention (TTT steps)", "lm_head + teacher/loss", "fc + MLP + projections"
OPTIMIZER, HOST, OTHER = "optimizer step", "data loading / host", "other"
GROUPS = (ATTENTION, HEAD, DENSE, OPTIMIZER, HOST, OTHER)
GROUP_OF = {
    "attention": ATTENTION,  # scores, softmax and values over the TTT keys, RoPE, GQA expand
    "lm_head": HEAD,  # the final norm and lm_head over each step's loss rows
    "loss": HEAD,  # soft cross-entropy, teacher rows, mask building
    "teacher_draft": HEAD,  # the target's logits over the draft vocabulary
    "teacher_full_vocab": HEAD,  # the target's full-vocab argmax (a sample's first epoch only)
    "fc": DENSE,
    "proj": DENSE,  # q, k, v, o
    "mlp": DENSE,
    "layer": DENSE,  # the decoder layer's norms, concatenation and residual adds
    "optimizer": OPTIMIZER,  # zero_grad, gradient clipping, finiteness check, AdamW step
    "data": HOST,  # waiting for the next batch and copying it to the device
    "host": HOST,  # wall time no op covers
}
SKIPPED = "prefetch"  # the loader thread: overlaps the step, not on its critical path


def _module_labels(objective: nn.Module) -> list[tuple[nn.Module, str]]:
    d = objective.drafter
    layer, attn = d.midlayer, d.midlayer.self_attn
    labels = [(objective, "loss"), (d.fc, "fc"), (layer, "layer"), (attn, "attention")]
    # q, k, v, o; or MLA's down and up projections and o
    labels += [(m, "proj") for m in attn.children() if isinstance(m, nn.Linear)]
    labels += [(layer.mlp, "mlp"), (d.norm, "lm_head"), (d.lm_head, "lm_head")]
    labels += [(n, "fc") for n in getattr(d, "fc_norm", [])]
    return labels


def _label_modules(objective: nn.Module) -> list:
    """Forward hooks opening `specbuild::<label>` around each module's forward; the handles."""
    handles = []
    for module, label in _module_labels(objective):
        stack: list[record_function] = []

        def enter(_m, _args, label=label, stack=stack) -> None:
            stack.append(record_function(PREFIX + label))
            stack[-1].__enter__()

        def leave(_m, _args, _out, stack=stack) -> None:
            stack.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    return handles


def group_times(events: list, *, wall_us: float, device: bool) -> tuple[dict, dict]:
    """(microseconds per group, microseconds per label) of profiler `events` over `wall_us`.

    `device`: count device kernel time (CUDA) instead of op time on the CPU thread.
    Labels besides GROUP_OF's: "unroll" (embedding and RoPE), "" (no label),
    "backward (unmatched)" (a backward op whose forward op was not seen), "host".
    """
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    own: dict[int, object] = {}  # id(event) -> label str, or ("bwd", key) inside a backward node

    def label_of(e) -> object:
        chain = []
        while e is not None and id(e) not in own:
            chain.append(e)
            e = e.cpu_parent
        found = own.get(id(e), "") if e is not None else ""
        for x in reversed(chain):  # outermost first: an inner label overrides
            if x.name.startswith(PREFIX):
                found = x.name[len(PREFIX) :]
            elif x.name.startswith(BACKWARD):
                found = ("bwd", (x.fwd_thread, x.sequence_nr))
            own[id(x)] = found
        return found

    fwd: dict[tuple[int, int], tuple[float, str]] = {}  # (thread, seq) -> (start, label)
    for e in cpu:
        label = label_of(e)
        if isinstance(label, str) and e.sequence_nr >= 0:
            # the op that made autograd node `seq` is the last one to start with that number
            key, start = (e.thread, e.sequence_nr), e.time_range.start
            if key not in fwd or fwd[key][0] <= start:
                fwd[key] = (start, label)
    per_label: dict[str, float] = {}
    for e in cpu:
        label = label_of(e)
        if not isinstance(label, str):
            label = fwd.get(label[1], (0, "backward (unmatched)"))[1]
        if device:  # a range opens no kernels of its own (skip annotation copies on the GPU)
            ranges = getattr(e, "is_user_annotation", False)
            us = 0.0 if ranges else sum(k.duration for k in e.kernels)
        else:
            us = e.self_cpu_time_total
        per_label[label] = per_label.get(label, 0.0) + us
    per_label.pop(SKIPPED, None)
    per_label["host"] = max(0.0, wall_us - sum(per_label.values()))
    groups = dict.fromkeys(GROUPS, 0.0)
    for label, us in per_label.items():
        groups[GROUP_OF.get(label, OTHER)] += us
    return groups, per_label


class StepProfiler(Observer):
    """Profiles steps WARMUP_STEPS+1 .. +PROFILE_STEPS of this run (fewer in a short run) on
    rank 0 and writes `out` (JSON), `<out stem>.txt` (the table and torch's top ops) and a
    Chrome trace `<out stem>.trace.json.gz` (chrome://tracing, ui.perfetto.dev)."""

    def __init__(
        self, out: str | os.PathLike, *, warmup: int = WARMUP_STEPS, steps: int = PROFILE_STEPS
    ) -> None:
        self.out, self.warmup, self.steps = Path(out), warmup, steps
        self.seen, self.first, self.last = 0, 0, -1  # steps of this run, 1-based
        self.prof, self.handles, self.t0, self.run = None, [], 0.0, None

    def on_start(self, run: TrainRun) -> None:
        if run.ranks.rank != 0:
            return
        self.run, todo = run, run.total_steps - run.state.step
        self.first = min(self.warmup, max(todo - 1, 0)) + 1
        self.last = min(self.first + self.steps - 1, todo)
        if self.first == 1 <= self.last:
            self._begin()

    def on_step(self, run: TrainRun) -> None:
        """After a step: the next one may be the first profiled, this one the last."""
        if self.run is None:
            return
        self.seen += 1
        if self.seen == self.last:
            self.on_end(run)
        elif self.seen == self.first - 1:
            self._begin()

    def _sync(self) -> None:
        if self.run.ranks.device.type == "cuda":
            torch.cuda.synchronize(self.run.ranks.device)

    def _begin(self) -> None:
        activities = [ProfilerActivity.CPU]
        if self.run.ranks.device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.handles = _label_modules(self.run.objective)
        self._sync()
        self.prof = profile(activities=activities)
        self.prof.start()
        self.t0 = time.perf_counter()

    def on_end(self, run: TrainRun) -> None:
        """Stop (if running) and write the report; a no-op once written."""
        if self.prof is None:
            return
        self._sync()
        wall = time.perf_counter() - self.t0
        self.prof.stop()
        for h in self.handles:
            h.remove()
        prof, self.prof, self.handles = self.prof, None, []
        self._write(prof, wall, steps=self.seen - self.first + 1)

    def _write(self, prof: profile, wall: float, *, steps: int) -> None:
        device = self.run.ranks.device
        on_device = device.type == "cuda"
        groups, labels = group_times(list(prof.events()), wall_us=wall * 1e6, device=on_device)
        report = {
            "device": device_name(device),
            "basis": "device kernel time" if on_device else "op time on the training thread",
            "steps": [self.first, self.first + steps - 1],
            "wall_s": wall,
            "groups": {g: {"s": us / 1e6, "share": us / 1e6 / wall} for g, us in groups.items()},
            "labels": {k: us / 1e6 for k, us in sorted(labels.items())},
        }
        write_json(self.out, report)
        table = format_report(report)
        sort = "self_device_time_total" if on_device else "self_cpu_time_total"
        top = prof.key_averages().table(sort_by=sort, row_limit=40)
        with atomic_path(self.out.with_suffix(".txt")) as tmp:
            tmp.write_text(table + "\n\n" + top + "\n", encoding="utf-8")
        trace = self.out.with_suffix(".trace.json")
        prof.export_chrome_trace(str(trace))
        with open(trace, "rb") as src, gzip.open(f"{trace}.gz", "wb") as dst:
            dst.write(src.read())
        trace.unlink()
        log.info("profile -> %s\n%s", self.out, table)


def format_report(report: dict) -> str:
    """The printed table: each group's seconds and share, its labels indented below it."""
    first, last = report["steps"]
    lines = [
        f"profile of steps {first}-{last} on {report['device']} ({report['basis']}; "
        f"wall {report['wall_s']:.3f} s)",
        f"{'group / label':<34}{'s':>9}{'share':>9}",
    ]
    wall = report["wall_s"]
    for g, row in report["groups"].items():
        lines.append(f"{g:<34}{row['s']:>9.3f}{100 * row['share']:>8.1f}%")
        for label, s in report["labels"].items():
            if GROUP_OF.get(label, OTHER) == g and s > 0:
                name = label or "(no label)"
                lines.append(f"  {name:<32}{s:>9.3f}{100 * s / wall:>8.1f}%")
    total = sum(r["share"] for r in report["groups"].values())
    lines.append(
        f"{'total':<34}{sum(r['s'] for r in report['groups'].values()):>9.3f}{100 * total:>8.1f}%"
    )
    return "\n".join(lines)
