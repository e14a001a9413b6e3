"""A split's images as the model reads them: normalised float NCHW on the workload's device, prepared batch by
batch from the compact uint8 store the data source holds, or held prepared when they are few.

At 32 pixels a whole data set prepared is a few hundred MB, and holding it saves converting each batch again; at
224 pixels each image is 600 kB as float32 against 150 kB as uint8, and 50,000 validation images prepared would
fill 30 GB. Slicing (`x[a:b]`) gives a prepared tensor; `part(a, b)` a lazy view for code that walks batches.

Example:
    >>> x = wl.split("val").x
    >>> x.shape, x[:64].shape                        # (N, 3, 224, 224), a prepared batch of 64
    >>> for batch in x.part(0, 500).batches(128):
    ...     model(batch)
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import torch

__all__ = ["Images", "as_tensor"]

Prepare = Callable[[torch.Tensor], torch.Tensor]


class Images:
    """Images read as the model reads them, without holding them prepared unless `resident`.

    Args:
        raw: The store: uint8 (N, H, W, C) images, or float (N, C, H, W) ones already preprocessed.
        prepare: Raw rows -> normalised float NCHW on `device`.
        shape: (C, H, W) of a prepared image.
        device: Where prepared images land.
        resident: Prepare every image once now and keep them (fast for small sets).
    """

    def __init__(self, raw: torch.Tensor, prepare: Prepare, shape: Sequence[int], device: torch.device,
                 resident: bool = False) -> None:
        self._raw = raw
        self._prepare = prepare
        self._chw = tuple(int(s) for s in shape)
        self.device = device
        self._full = prepare(raw) if resident else None
        self._start, self._stop = 0, len(raw)
        self._parts: tuple[Images, ...] = ()

    @classmethod
    def cat(cls, parts: Sequence[Images]) -> Images:
        """The parts one after another, without copying any of them."""
        first = parts[0]
        out = cls.__new__(cls)
        out._raw, out._prepare, out._chw, out.device, out._full = first._raw, first._prepare, first._chw, \
            first.device, None
        out._start, out._stop = 0, sum(len(p) for p in parts)
        out._parts = tuple(parts)
        return out

    @property
    def resident(self) -> bool:
        return self._full is not None or (bool(self._parts) and all(p.resident for p in self._parts))

    @property
    def shape(self) -> torch.Size:
        return torch.Size((len(self), *self._chw))

    @property
    def dtype(self) -> torch.dtype:
        return torch.float32

    def __len__(self) -> int:
        return self._stop - self._start

    def __getitem__(self, key: slice) -> torch.Tensor:
        """Prepared images `key` (a slice with step 1), on the device."""
        a, b = self._bounds(key)
        if self._parts:
            return torch.cat([p[max(a - o, 0) : b - o] for p, o in self._offsets() if a < o + len(p) and b > o]) \
                if b > a else self._empty()
        if self._full is not None:
            return self._full[self._start + a : self._start + b]
        if b <= a:
            return self._empty()
        return self._prepare(self._raw[self._start + a : self._start + b])

    def part(self, start: int, stop: int | None = None) -> Images:
        """Images start..stop as a view, prepared only when read."""
        a, b = self._bounds(slice(start, stop))
        if self._parts:
            return Images.cat([p.part(max(a - o, 0), b - o) for p, o in self._offsets() if a < o + len(p) and b > o]
                              or [self._parts[0].part(0, 0)])
        out = Images.__new__(Images)
        out._raw, out._prepare, out._chw, out.device, out._full = self._raw, self._prepare, self._chw, \
            self.device, self._full
        out._start, out._stop, out._parts = self._start + a, self._start + b, ()
        return out

    def batches(self, size: int) -> Iterator[torch.Tensor]:
        """Prepared batches of `size` images, in order."""
        for i in range(0, len(self), size):
            yield self[i : i + size]

    def tensor(self) -> torch.Tensor:
        """Every image prepared at once (memory grows with their number: for a few images, or small ones)."""
        return self[0 : len(self)]

    def cpu(self) -> torch.Tensor:
        return self.tensor().cpu()

    def _bounds(self, key: slice) -> tuple[int, int]:
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError(f"images are read by slices of step 1 (x[a:b]); got {key!r}")
        a, b, _ = key.indices(len(self))
        return a, max(a, b)

    def _offsets(self) -> Iterator[tuple[Images, int]]:
        o = 0
        for p in self._parts:
            yield p, o
            o += len(p)

    def _empty(self) -> torch.Tensor:
        return torch.empty((0, *self._chw), device=self.device)


def as_tensor(x: torch.Tensor | Images) -> torch.Tensor:
    """`x` whole as one prepared tensor (for code that needs it so: a few images, or timing)."""
    return x if isinstance(x, torch.Tensor) else x.tensor()
