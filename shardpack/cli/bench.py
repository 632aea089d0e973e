"""``shardpack bench``: a thin command over :func:`shardpack.inspect.bench.run`."""

from __future__ import annotations

import click

from shardpack.cli.common import quiet_option, show_progress
from shardpack.cli.options import click_options
from shardpack.core.errors import ShardpackError
from shardpack.inspect.sweep import SweepOptions


@click.command()
@click.argument("datasets", metavar="DATASET_OR_SRC...", nargs=-1)
@click.option("--files", "files", type=click.Path(exists=True, file_okay=False), default=None,
              help="Run the same pipeline over an unpacked file tree instead (ImageFolder or any "
                   "files), to compare with the packed DATASET.")
@click.option("--skip-bad", "on_error", flag_value="skip", default="raise",
              help="With --files: skip and count the tree's bad entries (broken links, special "
                   "files) as `pack --skip-bad` does, instead of stopping at the first.")
@click.option("--weights", default=None, metavar="W1,W2,...",
              help="Several DATASETs are read as one mixture (docs/mixing.md): their relative "
                   "shares [default: each dataset once].")
@click.option("--epoch-size", type=click.IntRange(min=1), default=None,
              help="Samples in a mixture's epoch [default: the datasets' sum].")
@click.option("--decode", type=click.Choice(["none", "cpu", "gpu"]), default=None,
              help="none: bytes only; cpu: decode + crop in the workers; "
              "gpu: nvJPEG on the device (needs CUDA and torchvision) [default: none; cpu with "
              "--sweep].")
@click.option("--workers", type=click.IntRange(min=0), default=2, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=256, show_default=True)
@click.option("--size", type=click.IntRange(min=8), default=224, show_default=True,
              help="Output image side when decoding.")
@click.option("--step-ms", type=click.FloatRange(min=0), default=0.0,
              help="Simulate a training step of this many ms per batch and report the fraction "
                   "of wall time spent waiting for data.")
@click.option("--batches", type=click.IntRange(min=1), default=None,
              help="Stop after this many batches [default: one epoch].")
@click.option("--device", default=None, help="cpu or cuda [default: cuda if available].")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=str), default=None,
              metavar="FILE", help="Write samples/s over time and the wait per step as a PNG, "
                                   "first batch marked (needs matplotlib: pip install "
                                   "'shardpack[plot]').")
@click_options(SweepOptions)
@quiet_option
def bench(datasets, files, on_error, weights, epoch_size, decode, workers, batch_size, size,
          step_ms, batches, device, plot, quiet, **sweep_options):
    """Measure the real loading pipeline on DATASET: samples/s, MB/s, time to first batch, and
    with --step-ms how long a training step would wait for data.  Several DATASETs: a mixture
    (--weights, --epoch-size).

    With --sweep (docs/diagnose.md): why the step waits and what fixes it.  DATASET_OR_SRC is a
    packed dataset (with --files TREE: its raw files too) or a raw image tree; the other options
    are your starting point, and each lever that applies is measured against it within --budget
    seconds: one table, the stage that bounds you, and the smallest configuration that keeps the
    wait under 5% of the step, with the code to use it."""
    from shardpack.inspect.bench import BenchOptions, run

    sweep = SweepOptions(**sweep_options)
    if sweep.sweep:
        return _sweep(datasets, files, on_error, decode or "cpu", workers, batch_size, size,
                      step_ms, device, plot, quiet, sweep)
    given = [flag for flag, value in (("--json", sweep.json_path), ("--model", sweep.model),
                                      ("--transform", sweep.transform))
             if value is not None]
    if given:
        raise ShardpackError(f"{given[0]} is for --sweep", hint="add --sweep")
    decode = decode or "none"
    shares = _check_plain(datasets, files, on_error, weights, epoch_size)
    dataset = list(datasets) if len(datasets) > 1 else (datasets[0] if datasets else None)
    if plot is not None:
        from shardpack.inspect.sampling import require_plot

        require_plot()  # before the run, not after it
    from shardpack.loader.torchenv import torch

    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    if decode == "gpu" and not device.startswith("cuda"):
        raise ShardpackError("--decode gpu needs a CUDA device; this machine has none",
                             hint="use --decode cpu")
    opts = BenchOptions(decode=decode, workers=workers, batch_size=batch_size, size=size,
                        step_ms=step_ms, batches=batches, device=device, weights=shares,
                        epoch_size=epoch_size, on_error=on_error)
    result = run(dataset, opts, files=files, progress=show_progress(quiet))
    for line in result.lines():
        click.echo(line)
    if plot is not None:
        result.timeline.plot(plot, f"{result.source}: decode {decode}, {workers} workers, "
                                   f"batch {batch_size}", step_ms)
        click.echo(f"plot          {plot}")


def _check_plain(datasets, files, on_error, weights, epoch_size) -> tuple | None:
    """Refuse what a plain bench cannot do; the mixture's shares, where given."""
    if bool(datasets) == (files is not None):
        raise ShardpackError("give a DATASET (or several) or --files SRC_DIR (one of them)")
    if on_error == "skip" and files is None:
        raise ShardpackError("--skip-bad is for --files: a packed DATASET has no bad entries "
                             "to skip (`shardpack verify` checks it)")
    if (weights or epoch_size) and len(datasets) < 2:
        raise ShardpackError("--weights and --epoch-size are for a mixture: give several "
                             "DATASETs")
    shares = None
    if weights:
        try:
            shares = tuple(float(w) for w in weights.split(","))
        except ValueError:
            raise ShardpackError(f"--weights {weights!r}: give numbers, e.g. 3,1") from None
        if len(shares) != len(datasets):
            raise ShardpackError(f"--weights has {len(shares)} values for {len(datasets)} "
                                 "datasets")
    return shares


def _sweep(datasets, files, on_error, decode, workers, batch_size, size, step_ms, device, plot,
           quiet, opts: SweepOptions) -> None:
    from shardpack.inspect import verdict
    from shardpack.inspect.sweep import Data, remove, sweep, workspace
    from shardpack.inspect.trial import Config
    from shardpack.loader.torchenv import torch

    if len(datasets) != 1:
        raise ShardpackError("--sweep takes one DATASET_OR_SRC")
    cuda = torch.cuda.is_available() and not (device or "cuda").startswith("cpu")
    if opts.model and not cuda:
        raise ShardpackError(f"--model {opts.model} runs a train step on CUDA: none here",
                             hint="give your step time with --step-ms instead")
    if not opts.model and not step_ms:
        raise ShardpackError("--sweep needs your training step: --step-ms MS (or --model NAME "
                             "on a GPU)", hint="time one step of your training loop")
    if decode == "gpu" and not cuda:
        raise ShardpackError("--decode gpu needs a CUDA device; this machine has none",
                             hint="use --decode cpu")
    if plot is not None:
        from shardpack.inspect.sampling import require_plot

        require_plot()
    work = workspace()
    try:
        data = Data(datasets[0], files, work, on_error)
        start = Config(name="start (your options)", lever="start",
                       path=data.packed or data.files, files=data.packed is None,
                       workers=workers, execution=opts.execution,
                       prefetch_batches=opts.prefetch_batches, decode=decode,
                       prefetch_shards=opts.prefetch_shards, cache_dir=opts.cache_dir,
                       batch_size=batch_size, size=size, step_ms=step_ms, model=opts.model,
                       transform=opts.transform, device="cuda" if cuda else "cpu")
        result = sweep(start, data, opts, cuda=cuda, progress=show_progress(quiet))
        for line in verdict.lines(result):
            click.echo(line)
        if opts.json_path is not None:
            verdict.write_json(result, opts.json_path)
            click.echo(f"json          {opts.json_path}")
        if plot is not None:
            verdict.plot(result, plot)
            click.echo(f"plot          {plot}")
    finally:
        remove(work)


COMMANDS = (bench,)
