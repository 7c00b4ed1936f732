"""The leader's collector policy (``labq.leader.collector``), in a process of its own: it changes the whole
process's garbage collector, which the test process must keep as it is."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent("""
    import gc, json, weakref
    from labq.leader.collector import FreezingCollector, freeze_after_full_collections

    class Node:
        pass

    def cycle():
        a, b = Node(), Node()
        a.other, b.other = b, a
        return a

    seen = {}
    now = [0.0]
    collector = FreezingCollector(monotonic=lambda: now[0], thaw_s=100.0)
    gc.callbacks.append(collector)
    gc.collect()
    seen["frozen_after_full"] = gc.get_freeze_count() > 0
    kept = cycle()
    old = weakref.ref(kept)
    gc.collect()  # the cycle, alive, is frozen with the rest
    del kept
    gc.collect(0)
    seen["young_collection_freezes_nothing"] = collector.frozen == 2
    gc.collect()
    seen["dead_frozen_cycle_kept"] = old() is not None
    young = cycle()
    new = weakref.ref(young)
    del young
    gc.collect()
    seen["dead_new_cycle_freed"] = new() is None
    now[0] = 100.0
    gc.collect()  # walks what is new, then thaws everything for the next one
    seen["thawed"] = gc.get_freeze_count() == 0 and collector.thawed == 1
    seen["still_kept_until_the_next_full_one"] = old() is not None
    gc.collect()  # walks everything: the dead cycle goes, what survives is frozen again
    seen["dead_frozen_cycle_freed_after_thaw"] = old() is None
    seen["frozen_again"] = gc.get_freeze_count() > 0 and collector.frozen == 5
    gc.callbacks.remove(collector)
    gc.unfreeze()
    first = freeze_after_full_collections()
    seen["one_per_process"] = first is freeze_after_full_collections() and gc.callbacks.count(first) == 1
    print(json.dumps(seen))
""")


def test_what_outlives_a_full_collection_is_frozen_and_everything_is_thawed_once_in_a_while():
    """After a full collection what survived is frozen, so the next ones walk only what is new; a cycle that was
    frozen and then died is kept until the thaw, after which the next full collection frees it; young
    collections freeze nothing; a process installs one collector however often it asks."""
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen == {key: True for key in seen} and len(seen) == 9, seen
