"""`bulk_fold(keep=True)`: what was built while the collector was paused is frozen out of its
reach (not scanned by the first collection after: 1.2 s for a million-record what-if) and the
collector runs again afterwards; without `keep` nothing is frozen."""

from __future__ import annotations

import gc

from kai_es.app import bulk_fold


def test_keep_freezes_what_was_built_and_resumes_collection() -> None:
    assert gc.isenabled()
    gc.unfreeze()
    try:
        with bulk_fold():
            built = [{"n": i} for i in range(1000)]
            assert not gc.isenabled()
        assert gc.isenabled() and gc.get_freeze_count() == 0
        with bulk_fold(keep=True):
            kept = [{"n": i} for i in range(1000)]
        assert gc.isenabled()
        assert gc.get_freeze_count() >= len(kept)
    finally:
        gc.unfreeze()
    assert built and kept
