"""A continuous batch's sequence ends at a stop string: found in the text its last piece could complete, not in the
whole text joined again at every step (the square of a sequence's length, on the replica's event loop)."""

from __future__ import annotations

import random

from ember_runtime.replica.continuous import _ends_in_stop


def test_a_stop_ending_in_the_last_piece_is_found_as_in_the_whole_text() -> None:
    rng = random.Random(11)
    for _ in range(5000):
        stops = ["".join(rng.choice("ab") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(0, 3))]
        pieces: list[str] = []
        for _ in range(rng.randint(1, 10)):
            pieces.append("".join(rng.choice("ab") for _ in range(rng.randint(0, 3))))
            before = "".join(pieces[:-1])
            if any(stop in before for stop in stops):
                break  # the sequence had ended at the piece before
            assert _ends_in_stop(pieces, stops) == any(stop in "".join(pieces) for stop in stops), (pieces, stops)
