"""What the benchmark measures besides the yardstick: the peak training memory's reading of /proc."""

from __future__ import annotations

import pytest

from transformer_xl.experiments.bench import measure


def test_rss_fields_are_read_from_proc_status() -> None:
    rss, peak = measure._rss_kib("VmRSS"), measure._rss_kib("VmHWM")
    assert 0 < rss <= peak
    with pytest.raises(OSError, match="VmNope not in /proc/self/status"):
        measure._rss_kib("VmNope")
