"""What a sweep's figures say: one table, the stage that bounds the starting point, and the
smallest measured configuration that keeps the wait under 5% of the step, with the code to use it.

Every figure is a median over the configuration's trials; its spread is the lowest and highest
samples/s of the windows its trials were cut in (:data:`shardpack.inspect.trial.WINDOWS` a trial).
Nothing here is estimated: a configuration that was not measured is not in the table, and the
levers that could not be tried are listed as such.
"""

from __future__ import annotations

import json
import statistics

from shardpack.loader.pipeline import DATASET_STAGES

WAIT_TARGET = 0.05  # the wait, as a share of the step's time, a recommendation must stay under
CORES_SLACK = 1.15  # the start is kept over a change that saves less than this share of cores
STAGE_KINDS = {"order": "I/O", "read": "I/O", "decode": "CPU decode",
               "transform": "CPU transform", "pin": "host copy", "device": "host copy"}


def summary(measured) -> dict:
    """The medians of a :class:`~shardpack.inspect.sweep.Measured`'s trials, with their spread
    and the batches they were measured over."""
    runs = measured.runs
    if not runs:
        return {}

    def median(key):
        values = [r[key] for r in runs if r.get(key) is not None]
        return statistics.median(values) if values else None

    windows = [w for r in runs for w in r["window_rates"]]
    stages = {}
    for name in runs[0]["stages"]:
        shares = [r["stages"][name]["share"] for r in runs if name in r["stages"]]
        busy = [r["stages"][name]["busy_s"] for r in runs if name in r["stages"]]
        stages[name] = {"share": statistics.median(shares), "busy_s": statistics.median(busy)}
    return dict(samples_per_s=median("samples_per_s"), wait_fraction=median("wait_fraction"),
                host_wait_fraction=median("host_wait_fraction"), cores=median("cores"),
                peak_bytes=median("peak_bytes"), stages=stages, timing=runs[0]["timing"],
                batches=sum(r["batches"] for r in runs), trials=len(runs),
                spread=[min(windows), max(windows)] if windows else None,
                first_batch_s=median("first_batch_s"))


def bound(figures: dict, cores: int) -> dict:
    """What bounds a configuration: ``"the step"`` when the wait is under target, else its
    busiest stage (the largest share of its workers' time), or the machine's CPUs when the
    pipeline used nearly all of them."""
    wait = figures.get("wait_fraction") or 0.0
    if wait < WAIT_TARGET:
        return {"stage": "step", "kind": "the training step (data keeps up)", "share": None}
    stages = figures.get("stages") or {}
    if figures.get("cores") and figures["cores"] >= 0.9 * cores:
        top = max(stages, key=lambda s: stages[s]["share"]) if stages else None
        return {"stage": top or "cpu", "kind": f"this machine's {cores} CPU cores",
                "share": stages[top]["share"] if top else None}
    if not any(name in DATASET_STAGES for name in stages):
        return {"stage": "workers", "kind": "the DataLoader workers (raw files have no stage "
                "counters)", "share": None}
    top = max(stages, key=lambda s: stages[s]["share"])
    return {"stage": top, "kind": STAGE_KINDS.get(top, top), "share": stages[top]["share"]}


def recommend(sweep) -> dict:
    """The smallest measured configuration whose wait is under :data:`WAIT_TARGET`: the fewest
    workers, then the fewest cores used, then the most samples/s; the starting point itself when
    it fits and uses no more than :data:`CORES_SLACK` more cores than that (cores measured over a
    few seconds are noisy: a change is recommended for what it saves, not for noise).  Else
    none, and why."""
    fits = []
    for m in sweep.measured:
        figures = summary(m)
        if figures and (figures["wait_fraction"] or 0.0) < WAIT_TARGET:
            fits.append(((m.config.workers, figures["cores"] or 0.0, -figures["samples_per_s"]),
                         m))
    if not fits:
        return {"name": None, "code": None,
                "why": f"no configuration measured here keeps the wait under "
                       f"{100 * WAIT_TARGET:.0f}% of a {sweep.step_ms:g} ms step"}
    key, chosen = min(fits, key=lambda fit: fit[0])
    start = next((fit for fit in fits if fit[1] is sweep.measured[0]), None)
    if start is not None and start[0][0] == key[0] and start[0][1] <= key[1] * CORES_SLACK:
        chosen = start[1]
    return {"name": chosen.config.name, "code": code_for(chosen.config, sweep),
            "start_fits": start is not None}


def code_for(config, sweep) -> str:
    """The code (and, for a pack-time resize, the command) that runs ``config``."""
    if config.files:
        return "# your raw-file loader keeps up: packing is not needed for this step time"
    lines = []
    path = repr(config.path)
    if config.path in sweep.packs:  # measured on a sample pack: make the real one
        lines.append(f"# {sweep.packs[config.path]}   (then read OUT)")
        path = "'OUT'"
    spec = f"shardpack.TransformSpec(size={config.size})"
    place = {"cpu": "cpu", "cpu-whole": "cpu", "gpu": "gpu"}.get(config.decode)
    args = [path, f"batch_size={config.batch_size}", "batched=True"]
    if place:
        args.append(f"decode=shardpack.Decode({spec}, place={place!r})")
    if config.transform:
        args.append(f"transform={config.transform.replace(':', '.')}")
    if config.execution == "threads":
        args += ["execution='threads'", f"workers={config.workers}"]
    if config.prefetch_shards != 2:
        args.append(f"prefetch_shards={config.prefetch_shards}")
    if config.cache_dir:
        args.append("cache_dir='/local/ssd/cache'")
    lines.append("ds = shardpack.ShardDataset(" + ", ".join(args) + ")")
    if config.execution == "threads":
        source = "ds"
    else:
        source = (f"DataLoader(ds, batch_size=None, num_workers={config.workers}, "
                  "persistent_workers=True)")
    extra = "" if config.prefetch_batches == 2 else f", prefetch_batches={config.prefetch_batches}"
    extra += "" if config.pin else ", pin_memory=False"
    lines.append(f"loader = shardpack.DeviceLoader({source}, device='cuda'{extra})")
    if config.decode == "cpu-whole":
        lines.insert(0, "# SHARDPACK_JPEG_REGION=0 in the environment: JPEGs decode whole")
    return "\n".join(lines)


def lines(sweep) -> list[str]:
    """The report: the table, what was not measured, the bound and the recommendation."""
    start = summary(sweep.measured[0]) if sweep.measured[0].runs else {}
    rate0 = start.get("samples_per_s")
    w = min(60, max([len("configuration")] + [len(m.config.name) for m in sweep.measured]
                    + [len(lever) for lever, _ in sweep.not_measured]))
    head = (f"{'configuration':<{w}} {'samples/s':>10} {'wait':>6} {'bound (busy)':>22} "
            f"{'cores':>5} {'peak MB':>8} {'vs start':>8}  batches, spread")
    out = [f"sweep: a {sweep.step_ms:g} ms step, {sweep.cores} cores, {sweep.elapsed_s:.0f} s "
           f"(budget {sweep.budget_s:.0f} s); wait = the device's idle share between steps "
           f"({start.get('timing', 'host')} timing)", "", head, "-" * len(head)]
    for m in sweep.measured:
        name = m.config.name[:w]
        if m.error is not None and not m.runs:
            out.append(f"{name:<{w}} failed: {m.error}")
            continue
        f = summary(m)
        b = bound(f, sweep.cores)
        busy = b["stage"] if b["share"] is None else f"{b['stage']} {100 * b['share']:.0f}%"
        ratio = f"{f['samples_per_s'] / rate0:.2f}x" if rate0 else "-"
        spread = (f"{f['spread'][0]:,.0f}-{f['spread'][1]:,.0f}/s" if f["spread"] else "-")
        out.append(f"{name:<{w}} {f['samples_per_s']:>10,.0f} "
                   f"{100 * (f['wait_fraction'] or 0):>5.1f}% {busy:>22} "
                   f"{_num(f['cores'], '.1f'):>5} {_num(_mb(f['peak_bytes']), ',.0f'):>8} "
                   f"{ratio:>8}  {f['batches']} in {f['trials']} trials, {spread}")
    for lever, why in sweep.not_measured:
        out.append(f"{lever:<{w}} not measured: {why}")
    out.append("")
    if start:
        b = bound(start, sweep.cores)
        out.append(f"the start is bound by {b['kind']}" + (f" ({b['stage']} stage busy "
                   f"{100 * b['share']:.0f}% of its workers' time)" if b["share"] else "")
                   + f"; it waits {100 * (start['wait_fraction'] or 0):.1f}% of the time")
    rec = recommend(sweep)
    if rec["name"] is None:
        best = max((m for m in sweep.measured if m.runs),
                   key=lambda m: summary(m)["samples_per_s"], default=None)
        out.append(rec["why"] + (f"; the fastest, {best.config.name}, is bound by "
                                 f"{bound(summary(best), sweep.cores)['kind']}" if best else ""))
    else:
        why = (f"the smallest configuration with the wait under {100 * WAIT_TARGET:.0f}%"
               + ("; your start keeps up too" if rec["start_fits"]
                  and rec["name"] != sweep.measured[0].config.name else ""))
        out += [f"use: {rec['name']} ({why})",
                *("    " + line for line in rec["code"].split("\n"))]
    return out + [f"note: {n}" for n in sweep.notes]


def as_json(sweep) -> dict:
    """Every figure: ``configurations`` (the start first), ``bound``, ``recommendation``,
    ``not_measured``, and the sweep's step, budget, time and cores."""
    import dataclasses

    rate0 = summary(sweep.measured[0]).get("samples_per_s") if sweep.measured[0].runs else None
    configurations = []
    for m in sweep.measured:
        f = summary(m)
        entry = {"name": m.config.name, "lever": m.config.lever,
                 "config": dataclasses.asdict(m.config), "error": m.error, "runs": m.runs}
        if f:
            entry.update(f, bound=bound(f, sweep.cores),
                         vs_start=f["samples_per_s"] / rate0 if rate0 else None)
        configurations.append(entry)
    start = summary(sweep.measured[0])
    return {"configurations": configurations,
            "bound": bound(start, sweep.cores) if start else None,
            "recommendation": recommend(sweep),
            "not_measured": [{"lever": lever, "why": why} for lever, why in sweep.not_measured],
            "step_ms": sweep.step_ms, "budget_s": sweep.budget_s, "elapsed_s": sweep.elapsed_s,
            "cores": sweep.cores, "wait_target": WAIT_TARGET, "notes": sweep.notes}


def write_json(sweep, path: str) -> None:
    """Write :func:`as_json`'s figures to ``path``."""
    with open(path, "w") as f:
        json.dump(as_json(sweep), f, indent=1)


def plot(sweep, path: str) -> None:
    """The table as a chart: samples/s per configuration, the wait beside each bar."""
    from shardpack.inspect.sampling import new_figure, save_figure

    rows = [(m.config.name, summary(m)) for m in sweep.measured if m.runs]
    fig = new_figure((9, 0.45 * len(rows) + 1.5))
    ax = fig.subplots()
    names = [name for name, _ in rows][::-1]
    rates = [f["samples_per_s"] for _, f in rows][::-1]
    waits = [f["wait_fraction"] or 0.0 for _, f in rows][::-1]
    colors = ["#2e86c1" if w < WAIT_TARGET else "#c0392b" for w in waits]
    ax.barh(names, rates, color=colors)
    for y, (rate, wait) in enumerate(zip(rates, waits, strict=True)):
        ax.text(rate, y, f" wait {100 * wait:.0f}%", va="center", fontsize=8)
    ax.set_xlabel(f"samples/s (blue: wait under {100 * WAIT_TARGET:.0f}% of a "
                  f"{sweep.step_ms:g} ms step)")
    ax.tick_params(axis="y", labelsize=8)
    save_figure(fig, path)


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mb(value):
    return None if value is None else value / 1e6
