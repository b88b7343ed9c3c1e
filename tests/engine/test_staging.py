"""The decode staging buffer rewrites a row's block table only where it changed, and is always right."""

import random

from laminar.engine.model_runner import _Staging


def test_block_tables_written_incrementally_match_a_full_write_every_step():
    rng = random.Random(0)
    st = _Staging(8, 12, pinned=False)
    st.fill_padding(8, scratch_block=99, block_size=16)
    tables = [[rng.randrange(90) for _ in range(rng.randrange(1, 4))] for _ in range(20)]
    for _ in range(300):
        rows = rng.sample(range(len(tables)), rng.randrange(1, 9))  # any requests, in any row order
        for r in rows:
            if rng.random() < 0.3 and len(tables[r]) < 12:
                tables[r].append(rng.randrange(90))  # a decode step crossed into a new block
            elif rng.random() < 0.05:
                tables[r] = [rng.randrange(90) for _ in range(rng.randrange(1, 4))]  # preempted, or moved in
        st.write_tables([tables[r] for r in rows])
        st.fill_padding(8, scratch_block=99, block_size=16, start=len(rows))
        for i, r in enumerate(rows):
            assert st.tables[i, : len(tables[r])].tolist() == tables[r]
        assert (st.tables[len(rows) :, 0] == 99).all()
