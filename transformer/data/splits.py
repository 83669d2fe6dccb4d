"""Split names: the names that mean the same split in different layouts, and a split's slice of its pairs
(``train[:-1000]``), how a corpus holds pairs out of training."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from transformer.errors import DataError

logger = logging.getLogger(__name__)

# Split names that mean the same split in different layouts (the local Multi30k folder says val and
# test2016, the hub's bentrevett/multi30k validation and test): a split that is not there under the
# name asked for is looked up under the other names of its group.
SPLIT_ALIASES = (("train", "training"), ("validation", "val", "valid", "dev"), ("test", "test2016"))


def split_aliases(split: str) -> tuple[str, ...]:
    """The names ``split`` goes by (`SPLIT_ALIASES`), itself included."""
    return next((names for names in SPLIT_ALIASES if split in names), (split,))


def resolve_split(split: str, available: list[str], where: str) -> str:
    """The name under which ``split`` exists in ``available``, through `SPLIT_ALIASES`, or a DataError."""
    if split in available:
        return split
    matches = [name for name in available if name in split_aliases(split)]
    if len(matches) == 1:
        logger.info("%s: split %r is called %r here", where, split, matches[0])
        return matches[0]
    train = [name for name in available if name in SPLIT_ALIASES[0]]
    held = f"; hold pairs out of {train[0]!r} instead with slices ({held_out_slices(train[0])})" \
        if train and split in SPLIT_ALIASES[1] + SPLIT_ALIASES[2] else ""  # a corpus of training pairs alone
    raise DataError(f"{where}: unknown split {split!r}; the splits are {', '.join(sorted(available)) or 'none'}"
                    f"{held}")


def held_out_slices(split: str) -> str:
    """Settings that hold validation and test pairs out of ``split``: its first pairs, counted from its start, so
    that they serve a stream too (whose length is not known before its end)."""
    return (f"data.valid_split='{split}[:1000]' data.test_split='{split}[1000:2000]' "
            f"data.train_split='{split}[2000:]'")


@dataclass(frozen=True)
class SplitSlice:
    """A split name with an optional slice of its pairs, written as `datasets` writes one (``train[:-1000]``,
    ``train[-1000:]``, ``train[:90%]``): how a corpus of one file, or without a validation split, holds pairs
    out of training. Percentages are rounded to the closest pair, as `datasets` rounds them."""

    name: str
    start: str | None = None
    stop: str | None = None

    @classmethod
    def parse(cls, text: str) -> SplitSlice:
        match = _SPLIT_SLICE.fullmatch(text)
        percents = [int(bound[:-1]) for bound in match.group("start", "stop") if bound and bound[-1] == "%"] \
            if match else []
        if match is None or any(abs(percent) > 100 for percent in percents):
            raise DataError(f"split {text!r}: expected a split's name, or a name and a slice of its pairs such as "
                            f"train[:-1000], train[-1000:] or train[:90%] (percentages within 100)")
        return cls(match["name"], match["start"], match["stop"])

    @property
    def sliced(self) -> bool:
        return self.start is not None or self.stop is not None

    @property
    def counts_from_start(self) -> bool:
        """Whether its bounds are pair numbers from the start (no percentage, nothing from the end): a stream's."""
        return all(bound is None or bound.isdigit() for bound in (self.start, self.stop))

    def rows(self, count: int) -> range:
        """The indices of the pairs it selects in its split of ``count`` pairs."""
        def index(bound: str | None) -> int | None:
            if bound is None or not bound.endswith("%"):
                return None if bound is None else int(bound)
            return round(int(bound[:-1]) * count / 100)
        return range(count)[index(self.start):index(self.stop)]


_SPLIT_SLICE = re.compile(r"(?P<name>\w+(?:\.\w+)*)(?:\[(?P<start>-?\d+%?)?:(?P<stop>-?\d+%?)?\])?")
