"""One decode operation, placed by an argument: ``Decode(spec, place="cpu"|"gpu")``.

The spec is given once, to the dataset's decode stage.  With ``place="cpu"`` the stage decodes in
the dataset's workers (a :class:`~shardpack.CpuDecode` with that spec); with ``place="gpu"`` the
workers ship the encoded bytes and :class:`~shardpack.DeviceLoader` decodes them on the device.
Either way the DeviceLoader reads the place and the spec from the dataset, so training code names
neither twice (docs/device.md, "One decode operation").
"""

from __future__ import annotations

from shardpack.loader.stages import EpochStage
from shardpack.transforms.decode import CpuDecode
from shardpack.transforms.spec import TransformSpec, spec_of

PLACES = ("cpu", "gpu")


class Decode(EpochStage):
    """The dataset's decode stage, decoding where ``place`` says.

    Args:
        spec: the :class:`~shardpack.transforms.spec.TransformSpec` (crops, size, dtype,
            layout, normalisation); None: one from ``size``, ``train``, ``seed``, ``flip``.
        place: ``"cpu"`` (in the dataset's workers) or ``"gpu"`` (in the DeviceLoader).
        field: the image field (None: found by name).
        on_error: ``"raise"`` or ``"skip"`` (a zero image, flagged) an image nothing decodes.
        size: the output side (without ``spec``).
        train: random-resized crops and flips (without ``spec``).
        seed: the crops' seed (without ``spec``).
        flip: flip half the training images (without ``spec``).
        **cpu: further :class:`~shardpack.CpuDecode` arguments for ``place="cpu"``
            (``threads``, ``head_start``, ``max_pixels``).
    """

    def __init__(self, spec: TransformSpec | None = None, *, place: str = "cpu",
                 field: str | None = None, on_error: str = "raise", size: int | None = None,
                 train: bool | None = None, seed: int | None = None, flip: bool | None = None,
                 **cpu):
        if place not in PLACES:
            raise ValueError(f"place must be one of {PLACES}, got {place!r}")
        if cpu and place != "cpu":
            raise ValueError(f"{', '.join(sorted(cpu))} is for place='cpu'")
        self.place, self.field, self.on_error = place, field, on_error
        self.spec = spec_of(spec, size=size, train=train, seed=seed, flip=flip)
        self._cpu = CpuDecode(spec=self.spec, field=field, on_error=on_error, **cpu) \
            if place == "cpu" else None

    def begin(self, epoch: int) -> None:
        """An iteration of ``epoch`` starts (the CPU decode's crops follow it).

        Args:
            epoch: the epoch.
        """
        super().begin(epoch)
        if self._cpu is not None:
            self._cpu.begin(epoch)

    def __call__(self, batch: dict) -> dict:
        """The batch decoded (``place="cpu"``), or as it is (``"gpu"``: bytes go on)."""
        return self._cpu(batch) if self._cpu is not None else batch
